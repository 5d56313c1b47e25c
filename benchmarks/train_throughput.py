"""Training throughput of the DFlash objective: seconds per optimizer step and blocks per second.

One step = build a batch of blocks from real distilled answers (first shard of the store, its cached
tap features), the drafter's forward through ``train.recipe.BlockLoss``, backward, AdamW. This is the
step ``dflash-sglang train`` runs, without data loading, evaluation or checkpointing around it.

    python benchmarks/train_throughput.py --head-dtype float32 --steps 12 \
        --batch-size 4 --blocks-per-seq 32 --train-vocab 8192 --out /tmp/tp.json

``BASE=/path/to/old/checkout`` measures another code tree with the same harness (the editable
install of this checkout is dropped from ``sys.meta_path``); options the old tree lacks must be left
out. Run it on an otherwise idle machine: two threads, the whole of a 2-core box.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if os.environ.get("BASE"):  # measure another code tree
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, os.environ["BASE"])

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default="data/distill/smollm2-135m")
    p.add_argument("--head-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--blocks-per-seq", type=int, default=16)
    p.add_argument("--train-vocab", type=int, default=0, help="0: exact softmax over the whole vocabulary")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON file (default: print only)")
    a = p.parse_args()

    import dflash_sglang
    from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
    from dflash_sglang.core.target import load_hf_target
    from dflash_sglang.models import fetch_model
    from dflash_sglang.platform.allocator import tune_allocator
    from dflash_sglang.train import recipe
    from dflash_sglang.train.data import Sample

    tune_allocator()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, _ = load_hf_target(str(fetch_model("smollm2-135m")))
    drafter = random_drafter(drafter_config_for(model.config, 2, 16, 0, 5), 0).float().train()
    z = np.load(f"{a.store}/shard_00000.npz")
    taps = np.load(f"{a.store}/taps_1-8-14-20-27/shard_00000.npy", mmap_mode="r")
    samples = [Sample(torch.from_numpy(z["ids"][o:o + t].astype(np.int64)), int(pl),
                      torch.from_numpy(np.array(taps[o:o + t - 1])).view(torch.bfloat16))
               for o, t, pl in zip(z["offset"], z["total_len"], z["prompt_len"], strict=True)]
    extra = {}
    if a.train_vocab:
        answers = [s.ids[s.prompt_len:] for s in samples]
        extra["train_vocab"] = recipe.select_draft_vocab(answers, a.train_vocab, 49152, (2,))[0]
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    loss_mod = recipe.BlockLoss(drafter, emb, head, 7.0, getattr(torch, a.head_dtype), **extra)
    opt = torch.optim.AdamW(drafter.parameters(), lr=6e-4)
    gen = torch.Generator().manual_seed(0)
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        picked = [samples[(step * a.batch_size + j) % len(samples)] for j in range(a.batch_size)]
        anchors = [recipe.sample_anchors(s.prompt_len, len(s.ids), a.blocks_per_seq, gen) for s in picked]
        b = recipe.build_batch([s.ids for s in picked], anchors, [s.taps for s in picked], 16,
                               a.blocks_per_seq, 0)
        out = loss_mod(b)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        print(f"step {step}: {times[-1]:.2f} s, loss {float(out.loss):.3f}", flush=True)
    s_per_step = float(np.median(times[1:] if len(times) > 1 else times))
    blocks = a.batch_size * a.blocks_per_seq
    from dflash_sglang.bench.machine import describe_machine

    res = {"code": dflash_sglang.__file__, "args": vars(a), "median_s_per_step": round(s_per_step, 3),
           "blocks_per_step": blocks, "blocks_per_s": round(blocks / s_per_step, 1),
           "machine": describe_machine()}
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
