"""End to end: the real ``dflash-sglang bench`` CLI, in a subprocess, on a tiny setting.

Three servers one after another (no-spec, our DFLASH with a random drafter, SGLang's built-in
DFLASH, which on the CPU platform is expected to be recorded as unavailable), 2 prompts, 8 new
tokens, concurrency 1 and 2. Checks results.json, the plots and the summary line agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_sglang.bench.report import PLOTS, RESULTS_FILE
from dflash_sglang.core.random_drafter import build_random_drafter
from dflash_sglang.models import fetch_model

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "dflash_sglang.cli"]
# About 3 server start-ups: ~3 minutes on an idle 2-core box; the limit leaves room for a loaded one.
TIMEOUT_S = 900
Run = tuple[subprocess.CompletedProcess[str], Path]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("bench")
    target = fetch_model("smollm2-135m", log=lambda _m: None)
    # what `dflash-sglang random-drafter --target T --out DIR --block-size 8` does, without a second
    # interpreter start-up
    drafter = build_random_drafter(target, root / "rand8", block_size=8)
    out = root / "out"
    cmd = [*CLI, "bench", "--target", str(target), "--drafter", str(drafter), "--block-size", "8",
           "--limit", "2", "--max-new-tokens", "8", "--concurrency", "1,2",
           "--methods", "nospec,dflash,builtin", "--startup-timeout", "300", "--out", str(out),
           "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=dict(os.environ))
    return proc, out


def test_bench_cli_writes_consistent_results(bench_run: Run) -> None:
    proc, out = bench_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    data = json.loads((out / RESULTS_FILE).read_text())
    assert summary["results"] == str(out / RESULTS_FILE)
    for name in PLOTS.values():
        assert (out / name).stat().st_size > 0, name

    methods = data["methods"]
    assert methods["nospec"]["status"] == "ok" and methods["dflash"]["status"] == "ok"
    assert methods["builtin"]["status"] in ("ok", "unavailable")
    if methods["builtin"]["status"] == "unavailable":
        assert methods["builtin"]["reason"] and "\n" not in methods["builtin"]["reason"]
    assert data["settings"]["prompts"] == 2 and data["settings"]["concurrency"] == [1, 2]
    assert "--limit 2" in data["command"] and data["machine"]["cpu_cores"] >= 1

    for conc in ("1", "2"):
        base, spec = methods["nospec"]["levels"][conc], methods["dflash"]["levels"][conc]
        assert base["requests"] == spec["requests"] == 2
        assert 0 < spec["output_tokens"] <= 16
        # the server's own counters agree: tokens committed by verify steps (from the histogram of
        # accepted drafts) are the output tokens after the prefill's first, up to the drafts past the
        # end that the last step of each request may have cut (at most B-1 = 15 per request)
        hist, steps = spec["spec"]["correct_drafts_histogram"], spec["spec"]["verify_steps"]
        committed = steps + sum(k * n for k, n in enumerate(hist))
        after_first = spec["output_tokens"] - spec["requests"]
        assert after_first <= committed <= after_first + 15 * spec["requests"], (committed, after_first)
        speedup = spec["output_tokens_per_s"] / base["output_tokens_per_s"]
        assert summary["speedup"][conc] == pytest.approx(speedup, rel=1e-3)
    assert summary["tau"] == pytest.approx(methods["dflash"]["spec"]["tau"], rel=1e-3)
    assert len(methods["dflash"]["spec"]["acceptance_by_position"]) == 7
    assert "ngram_speedup" in summary
    assert set(summary["adaptive_block"]) == {"1", "2"}  # the policy's choice per concurrency
    logged = Path(methods["dflash"]["log"]).read_text().count("dflash-sglang: adaptive block ")
    assert logged == sum(len(methods["dflash"]["levels"][c]["adaptive_switches"]) for c in ("1", "2"))
    assert "dflash-sglang: our DFlash worker runs" in Path(methods["dflash"]["log"]).read_text()
