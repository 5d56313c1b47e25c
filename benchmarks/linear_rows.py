"""What a verify block costs in the target's linear layers: milliseconds for all of them, by rows and dtype.

A decode step runs every linear layer on 1 row; a DFlash verify step on B rows (the block), B x batch
under load. The question is how far from flat that cost is. This times SmolLM2-135M's linear shapes
(30 layers of q/k/v fused 576->960, o 576->576, gate/up fused 576->3072, down 1536->576, each layer
its own weights, so they stream from memory as in a real step, 424 MB in float32) with
``torch.nn.functional.linear`` at each row count, in float32 and in bfloat16, and writes JSON with the
machine description.

    python benchmarks/linear_rows.py --threads 1 --out benchmarks/results/linear-rows/smollm2-135m.json

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in) per layer
LAYERS = 30


def time_ms(weights: list[torch.Tensor], rows: int, dtype: torch.dtype, reps: int) -> float:
    xs = {k: torch.randn(rows, k, dtype=dtype) for k in {w.shape[1] for w in weights}}

    def once() -> None:
        for w in weights:
            F.linear(xs[w.shape[1]], w)

    for _ in range(2):
        once()
    start = time.perf_counter()
    for _ in range(reps):
        once()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,16,32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from dflash_sglang.bench.machine import describe_machine

    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    out: dict[str, object] = {"machine": describe_machine(), "threads": args.threads, "layers": LAYERS,
                              "shapes_out_in": SHAPES, "ms": {}}
    for dtype in (torch.float32, torch.bfloat16):
        weights = [torch.randn(n, k).to(dtype) for _ in range(LAYERS) for n, k in SHAPES]
        ms = {r: time_ms(weights, r, dtype, args.reps) for r in rows}
        out["ms"][str(dtype).removeprefix("torch.")] = {  # type: ignore[index]
            str(r): {"ms": round(v, 2), "vs_1_row": round(v / ms[rows[0]], 2)} for r, v in ms.items()}
        print(dtype, {r: round(v, 1) for r, v in ms.items()})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
