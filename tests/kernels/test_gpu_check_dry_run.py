"""scripts/gpu_check.sh --dry-run runs end to end on CPU (tiny shapes, Triton interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("TRITON_INTERPRET", None)  # --dry-run must set it itself
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    meta = res["meta"]
    assert meta["dry_run"] is True and meta["triton_interpret"] == "1"
    assert meta["date"] and meta["torch"] and meta["triton"] and "gpu_name" in meta
    assert res["ok"] is True and res["errors"] == [] and res["sglang_imported"] is False
    assert res["correctness"] and all(c["ok"] for c in res["correctness"])
    assert {r["kernel"] for r in res["kernels"]} == {"context_kv_to_pool", "greedy_accept", "chain_rejection"}
    for r in res["kernels"]:
        assert r["kernel_ms"] > 0 and r["ref_ms"] > 0 and r["roofline_ms"] > 0
    assert [r["bs"] for r in res["latency"]] == meta["shapes"]["batches"]
    assert all(r["target_eager_ms"] > 0 and r["draft_eager_ms"] > 0 for r in res["latency"])
    assert [r["bs"] for r in res["overlap"]] == meta["shapes"]["batches"]
    assert "OK" in proc.stdout and "chain_rejection" in proc.stdout
