"""results.json schema and plot files, on synthetic results (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_sglang.bench.machine import describe_machine
from dflash_sglang.bench.report import PLOTS, SCHEMA, build_results, write_plots, write_results
from dflash_sglang.bench.stats import MethodResult, RequestRecord, level_stats, spec_stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records(tokens: int, verify: int, hist: tuple[int, ...]) -> list[RequestRecord]:
    return [RequestRecord(cat, 20, tokens, 0.05, 0.5, verify, hist) for cat in ("math", "coding")]


def _ok(name: str, tput_scale: float, positions: int) -> MethodResult:
    verify = 4 if positions else 0
    hist = (1, 1, 0, 2) if positions else ()
    levels = [level_stats(c, 16 / (tput_scale * c), _records(8, verify, hist), positions) for c in (1, 4)]
    pooled = spec_stats(_records(8, verify, hist) * 2, positions) if positions else None
    return MethodResult(name, "ok", ["--x"], {}, levels, pooled, None, "/tmp/log", [])


def synthetic_methods() -> dict[str, MethodResult]:
    return {
        "nospec": _ok("nospec", 1.0, 0),
        "dflash": _ok("dflash", 2.0, 15),
        "ngram": _ok("ngram", 1.25, 7),
        "builtin": MethodResult("builtin", "unavailable", ["--y"], {"DFLASH_SGLANG_WORKER": "builtin"}, [],
                                None, "RuntimeError: unknown parameter type", "/tmp/b.log", []),
    }


def test_results_json_schema(tmp_path: Path) -> None:
    results = build_results("dflash-sglang bench --limit 2", ["dflash-sglang", "bench"], describe_machine(),
                            {"concurrency": [1, 4]}, synthetic_methods())
    path = write_results(results, tmp_path)
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["command"].startswith("dflash-sglang bench")
    for key in ("cpu_model", "cpu_cores", "ram_gib", "os", "python", "torch", "sglang", "git_commit"):
        assert key in data["machine"]
    assert data["machine"]["cpu_cores"] >= 1
    builtin = data["methods"]["builtin"]
    assert builtin["status"] == "unavailable" and builtin["reason"].startswith("RuntimeError")
    dflash = data["methods"]["dflash"]
    assert set(dflash["levels"]) == {"1", "4"}
    level = dflash["levels"]["4"]
    for key in ("output_tokens_per_s", "ttft_ms", "tpot_ms", "latency_ms", "spec"):
        assert key in level
    assert set(level["latency_ms"]) == {"mean", "p50", "p90", "p99", "n"}
    assert dflash["spec"]["tau"] == pytest.approx(2.0)  # 8 tokens / 4 verify steps
    assert len(dflash["spec"]["acceptance_by_position"]) == 15
    assert dflash["spec"]["acceptance_by_position"][:4] == pytest.approx([0.75, 0.5, 0.5, 0.0])
    assert set(dflash["spec"]["tau_by_category"]) == {"coding", "math"}
    assert data["methods"]["nospec"]["spec"] is None
    assert data["summary"]["speedup"] == {"1": pytest.approx(2.0), "4": pytest.approx(2.0)}
    assert data["summary"]["ngram_speedup"] == {"1": pytest.approx(1.25), "4": pytest.approx(1.25)}
    assert data["summary"]["status"]["builtin"] == "unavailable"


def _assert_pngs(out: Path) -> None:
    for name in PLOTS.values():
        png = out / name
        assert png.is_file() and png.read_bytes()[:8] == PNG_MAGIC, name


def test_plots_are_written(tmp_path: Path) -> None:
    results = build_results("c", [], {}, {}, synthetic_methods())
    paths = write_plots(results, tmp_path)
    assert sorted(p.name for p in paths) == sorted(PLOTS.values())
    _assert_pngs(tmp_path)


def test_plots_survive_no_measured_method(tmp_path: Path) -> None:
    methods = {"builtin": synthetic_methods()["builtin"]}
    results = build_results("c", [], {}, {}, methods)
    write_plots(json.loads(json.dumps(results)), tmp_path)
    _assert_pngs(tmp_path)
