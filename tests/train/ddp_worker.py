"""Run by test_ddp.py under ``python -m torch.distributed.run --nproc_per_node 2`` (gloo on CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_sglang.train.loop import TrainConfig, train  # noqa: E402
from tests.train.tiny import EOS, tiny_drafter, tiny_model, tiny_prompts, tiny_samples, tiny_target  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    model = tiny_model()
    target = tiny_target(model)
    drafter = tiny_drafter(model)
    cfg = TrainConfig(out=str(out / "ckpt"), steps=4, batch_size=4, blocks_per_seq=4, lr=3e-3, warmup=2,
                      eval_max_new_tokens=8, show_progress=False, save_dtype="float32")
    res = train(cfg, drafter, target, tiny_samples(target, 8), tiny_prompts(2, 9), (EOS,))
    flat = torch.cat([p.detach().flatten() for p in drafter.parameters()]).double()
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({
        "world": dist.get_world_size(), "losses": [h["loss"] for h in res.history],
        "param_sum": float(flat.sum()), "param_abs": float(flat.abs().sum()),
    }))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
