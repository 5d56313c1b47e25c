"""DDP on CPU: two gloo processes launched with torch.distributed.run on the tiny target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dflash_sglang.train.loop import Dist, TrainConfig, batch_indices


def test_ranks_get_disjoint_shards() -> None:
    cfg = TrainConfig(out="x", batch_size=3, seed=4)
    for step in range(3):
        a, b = batch_indices(step, 12, cfg, Dist(0, 2)), batch_indices(step, 12, cfg, Dist(1, 2))
        assert not set(a) & set(b)
    epoch = [i for s in range(2) for r in range(2) for i in batch_indices(s, 12, cfg, Dist(r, 2))]
    assert sorted(epoch) == list(range(12))  # one epoch covers every sample exactly once


def test_torchrun_two_gloo_processes(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("ddp_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(worker), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r0["losses"] != r1["losses"]  # each rank trained on its own shard
    # DDP averaged the gradients: the in-memory weights of both ranks stay identical
    assert r0["param_sum"] == r1["param_sum"] and r0["param_abs"] == r1["param_abs"]
    assert (tmp_path / "ckpt" / "config.json").is_file()
    assert not any(p.name.startswith("rank1") for p in (tmp_path / "ckpt").iterdir())
