"""`make demo`: DFlash on the embedded default target (SmolLM2-135M-Instruct), on this machine.

Runs the reference engine over a few Spec-Bench prompts with the default drafter, checks the output
is token-for-token the target's own greedy output, and prints text, tau and speedup.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dflash_sglang.cli import main as cli_main
from dflash_sglang.core.random_drafter import build_random_drafter
from dflash_sglang.models import fetch_model

TRAINED = Path(__file__).resolve().parents[1] / "drafters" / "smollm2-135m-dflash-b16"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    target = fetch_model("smollm2-135m", log=lambda m: print(m, file=sys.stderr))
    if (TRAINED / "config.json").is_file():
        draft = TRAINED
    else:
        print("no trained drafter in the repo yet: using a random one (lossless, tau ~ 1)")
        draft = build_random_drafter(target, tempfile.mkdtemp(prefix="dflash-demo-"), block_size=16)
    return cli_main([
        "generate", "--target", str(target), "--draft", str(draft), "--prompts", args.prompts,
        "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens), "--block-size", "8",
        "--check-lossless",
    ])


if __name__ == "__main__":
    sys.exit(main())
