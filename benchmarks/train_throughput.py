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
           "roofline": roofline(a, s_per_step), "machine": describe_machine()}
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


def step_gflop(a: argparse.Namespace, ctx_len: float, hidden: int = 576, inter: int = 1536, heads: int = 9,
               kv_heads: int = 3, head_dim: int = 64, taps: int = 5, block: int = 16) -> dict[str, float]:
    """Matmul GFLOP of one training step at SmolLM2's drafter shapes (forward + backward; the frozen
    taps, embedding and LM head get no gradient). ``ctx_len``: mean padded context length per step.
    The softmax rows are counted as ``--train-vocab`` (the batch's extra label rows add a few %)."""
    s, nt = a.batch_size, a.batch_size * a.blocks_per_seq * block  # sequences, block tokens
    rows = a.batch_size * a.blocks_per_seq * (block - 1)  # loss rows through the head
    vocab = a.train_vocab or 49152
    kv = kv_heads * head_dim
    fc = 2 * 2 * s * ctx_len * taps * hidden * hidden  # forward + weight gradient
    ctx_kv = a.layers * 3 * 2 * s * ctx_len * hidden * 2 * kv
    per_layer = 2 * nt * hidden * (2 * heads * head_dim + 2 * kv + 3 * inter)
    layers = a.layers * 3 * per_layer
    attn = a.layers * 3 * 2 * 2 * nt * heads * head_dim * (ctx_len / 2 + block)  # a block sees ~half
    head = 2 * 2 * rows * vocab * hidden  # logits + d loss / d h (fused_ce)
    parts = {"fc": fc, "context_kv": ctx_kv, "layers": layers, "attention": attn, "lm_head": head}
    return {k: round(v / 1e9, 2) for k, v in parts.items()}


def roofline(a: argparse.Namespace, s_per_step: float) -> dict:
    """The step's matmul work against this machine's GEMM rate at the MLP's shape (bf16; float32 with
    --compute-dtype float32): the fastest this recipe's step can run, whatever is removed around the
    matmuls."""
    import time

    import torch

    from dflash_sglang.train.distill_store import DistillStore
    from dflash_sglang.train.loop import Dist, TrainConfig, batch_indices

    torch.set_num_threads(a.threads)
    lens = [len(x.ids) for x in DistillStore.open(a.store).samples()[:128]]  # train's --num-prompts 128
    cfg = TrainConfig(out="-", batch_size=a.batch_size)
    ctx = statistics.mean(max(lens[i] for i in batch_indices(st, len(lens), cfg, Dist())) - 1
                          for st in range(a.steps))
    parts = step_gflop(a, ctx)
    dtype = torch.float32 if a.compute_dtype == "float32" else torch.bfloat16
    x = torch.randn(a.batch_size * a.blocks_per_seq * 16, 576, dtype=dtype)
    w = torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        x @ w
    t0, reps = time.perf_counter(), 20
    for _ in range(reps):
        x @ w
    rate = 2 * x.shape[0] * 576 * 1536 * reps / (time.perf_counter() - t0) / 1e9
    total = sum(parts.values())
    floor = total / rate
    blocks = a.batch_size * a.blocks_per_seq
    return {"mean_context_len": round(ctx, 1), "gflop_per_step": parts, "gflop_total": round(total, 1),
            "gemm_gflop_per_s": round(rate, 1), "achieved_gflop_per_s": round(total / s_per_step, 1),
            "floor_s_per_step": round(floor, 3), "ceiling_blocks_per_s": round(blocks / floor, 1),
            "gemm_dtype": str(dtype).removeprefix("torch."),
            "note": "analytic matmul FLOPs (step_gflop) over the measured GEMM rate (gemm_dtype) at the "
                    "MLP's shape: the step cannot run faster than floor_s_per_step without doing less work"}


if __name__ == "__main__":
    main()
