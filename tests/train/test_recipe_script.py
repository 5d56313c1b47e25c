"""The shipped drafter's recipe script: every command it runs parses, and each stage warm-starts the one
before it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dflash_sglang.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_smollm2_drafter.sh"

# Stands in for the console script on PATH: records its argv, prints a model folder for `models fetch`.
RECORDER = """#!/usr/bin/env bash
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$CALLS"
[ "$1" = models ] && echo /models/smollm2-135m
exit 0
"""


def test_recipe_script_commands_parse_and_chain(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dflash-sglang").write_text(RECORDER)
    (bin_dir / "dflash-sglang").chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
           "WORK": str(tmp_path / "work")}
    subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env, check=True, timeout=60)
    argvs = [json.loads(x) for x in calls.read_text().splitlines()]
    assert [a[0] for a in argvs] == ["models", "train-prompts", "train", "train", "train-corpus", "distill",
                                     "distill", "train"]
    parsed = [build_parser().parse_args(a) for a in argvs[1:]]  # argparse exits on an unknown flag
    stage1, stage2, corpus, distill, heldout, stage3 = parsed[1:]
    assert stage1.target == stage2.target == "/models/smollm2-135m"
    assert (stage1.num_prompts, stage1.steps, stage1.layers, stage1.block_size) == (1024, 1150, 2, 16)
    assert stage2.init_from == stage1.out
    assert (stage2.num_prompts, stage2.steps) == (1536, 2000) and stage2.data == stage1.data
    assert stage2.state_dir != stage1.state_dir  # stage 2 must not resume stage 1's optimizer state
    assert distill.corpus == heldout.corpus == f"{corpus.out}/train.jsonl.gz"
    assert (distill.split, heldout.split) == ("train", "heldout") and distill.out != heldout.out
    assert stage3.init_from == stage2.out and stage3.out == str(tmp_path / "out")
    assert (stage3.store, stage3.eval_store) == (distill.out, heldout.out)
    committed = ROOT / "data" / "distill"
    assert (ROOT / distill.out).parent == committed and (ROOT / distill.out / "store.json").is_file()
    assert (stage3.steps, stage3.train_vocab, stage3.draft_vocab) == (2500, 8192, 16384)
