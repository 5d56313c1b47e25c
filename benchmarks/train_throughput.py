"""Training throughput of the DFlash objective: seconds per optimizer step and blocks per second.

Runs the real ``dflash-sglang train`` (``train.loop``'s step: batch, drafter forward through
``train.recipe.BlockLoss``, backward, clipping, AdamW) for a few steps on the first rows of a distill
store and reads each step's wall time from its ``train_log.jsonl`` (``step_s``: the step alone, no
data loading, tap filling, evaluation or checkpointing). The median over the steps after the first
is reported.

    python benchmarks/train_throughput.py --steps 12 --batch-size 4 --blocks-per-seq 32 \
        --train-vocab 8192 --out /tmp/tp.json

The store's tap features must be filled (``dflash-sglang train --store`` fills them once; they are
git-ignored). Run it on an otherwise idle machine: two threads, the whole of a 2-core box. The "before"
figure in the issue history (30.3 blocks/s, fp32 head, full softmax) came from an earlier version of
this harness that ran the old code tree's step (commit 7762fcf).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default="data/distill/smollm2-135m")
    p.add_argument("--head-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--compute-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="train --compute-dtype: autocast dtype of the step's matmuls")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--blocks-per-seq", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--train-vocab", type=int, default=0, help="0: exact softmax over the whole vocabulary")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON file (default: print only)")
    a = p.parse_args()

    from dflash_sglang.bench.machine import describe_machine
    from dflash_sglang.models import fetch_model

    with tempfile.TemporaryDirectory(prefix="train-throughput-") as tmp:
        target = str(fetch_model("smollm2-135m"))
        cmd = [sys.executable, "-m", "dflash_sglang.cli", "train", "--target", target, "--store", a.store,
               "--num-prompts", "128", "--eval-prompts", "0", "--steps", str(a.steps),
               "--eval-every", str(10 * a.steps), "--save-every", str(10 * a.steps), "--log-every", "1",
               "--layers", str(a.layers), "--batch-size", str(a.batch_size),
               "--blocks-per-seq", str(a.blocks_per_seq), "--train-vocab", str(a.train_vocab),
               "--head-dtype", a.head_dtype, "--compute-dtype", a.compute_dtype,
               "--threads", str(a.threads), "--warmup", "1",
               "--out", f"{tmp}/out", "--state-dir", f"{tmp}/state", "--no-resume"]
        subprocess.run(cmd, check=True)
        log = [json.loads(line) for line in Path(f"{tmp}/state/train_log.jsonl").read_text().splitlines()]
    times = [r["step_s"] for r in log if "step_s" in r]
    s_per_step = statistics.median(times[1:] if len(times) > 1 else times)
    blocks = a.batch_size * a.blocks_per_seq
    res = {"command": cmd[2:], "args": vars(a), "median_s_per_step": round(s_per_step, 3),
           "blocks_per_step": blocks, "blocks_per_s": round(blocks / s_per_step, 1),
           "machine": describe_machine()}
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
