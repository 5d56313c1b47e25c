"""Pure statistics of ``dflash-sglang bench``, against hand-computed numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_sglang.bench.cli import int_list, method_list, resolve_drafter, round_robin
from dflash_sglang.bench.runner import adaptive_switches, failure_reason, method_specs
from dflash_sglang.bench.stats import (
    LevelStats,
    MethodResult,
    RequestRecord,
    acceptance_by_position,
    adaptive_blocks,
    distribution,
    level_stats,
    merge_histograms,
    method_summary,
    percentile,
    spec_stats,
    speedups,
    summary_line,
    tau,
    tau_by_category,
    tpot_s,
)


def rec(tokens: int, verify: int = 0, hist: tuple[int, ...] = (), cat: str = "all", ttft: float = 0.1,
        latency: float = 1.0) -> RequestRecord:
    return RequestRecord(cat, 10, tokens, ttft, latency, verify, hist)


def test_percentile_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4, ranks 0..3
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(2.5)  # rank 1.5
    assert percentile(values, 90) == pytest.approx(3.7)  # rank 2.7
    assert percentile(values, 99) == pytest.approx(3.97)  # rank 2.97
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_scales_and_summarises() -> None:
    d = distribution([0.1, 0.2, 0.3], scale=1000.0)
    assert d is not None
    assert (d.mean, d.p50, d.n) == (pytest.approx(200.0), pytest.approx(200.0), 3)
    assert d.p90 == pytest.approx(280.0)  # rank 1.8: 200 + 0.8 * 100
    assert distribution([]) is None


def test_tpot_excludes_first_token() -> None:
    assert tpot_s(rec(5, ttft=0.2, latency=1.0)) == pytest.approx(0.2)  # 0.8 s / 4 tokens
    assert tpot_s(rec(1)) is None


def test_tau_is_tokens_over_verify_steps() -> None:
    assert tau([rec(10, 4), rec(6, 2)]) == pytest.approx(16 / 6)
    assert tau([rec(10)]) is None


def test_acceptance_by_position_from_histogram() -> None:
    hist = [2, 1, 0, 1]  # 4 steps: two with 0 correct drafts, one with 1, one with 3
    assert acceptance_by_position(hist, 4) == pytest.approx([0.5, 0.25, 0.25, 0.0])
    assert acceptance_by_position([], 3) == [0.0, 0.0, 0.0]


def test_merge_histograms_pads_shorter_ones() -> None:
    assert merge_histograms([[1, 2], [0, 1, 3], []]) == [1, 3, 3]


def test_tau_by_category() -> None:
    records = [rec(8, 2, cat="math"), rec(4, 2, cat="math"), rec(9, 3, cat="code"), rec(5, cat="none")]
    assert tau_by_category(records) == {"code": pytest.approx(3.0), "math": pytest.approx(3.0)}
    records = [rec(10, 2, cat="b"), rec(3, 3, cat="a")]
    assert tau_by_category(records) == {"a": pytest.approx(1.0), "b": pytest.approx(5.0)}


def test_spec_stats_pools_and_pads() -> None:
    records = [rec(5, 2, (1, 0, 1)), rec(3, 2, (1, 1))]  # steps: k=0,2 and k=0,1
    s = spec_stats(records, positions=4)
    assert s is not None
    assert s.tau == pytest.approx(2.0)
    assert s.verify_steps == 4
    assert s.correct_drafts_histogram == [2, 1, 1, 0, 0]
    assert s.acceptance_by_position == pytest.approx([0.5, 0.25, 0.0, 0.0])
    assert spec_stats([rec(5)], positions=4) is None


def test_level_stats_throughput_and_latency() -> None:
    records = [rec(10, latency=1.0), rec(30, latency=3.0)]
    lv = level_stats(2, wall_s=4.0, records=records, positions=0)
    assert (lv.requests, lv.output_tokens, lv.output_tokens_per_s) == (2, 40, pytest.approx(10.0))
    assert lv.latency_ms.p50 == pytest.approx(2000.0)
    assert lv.spec is None
    with pytest.raises(ValueError):
        level_stats(1, 0.0, records, 0)


def test_speedups_only_where_both_measured() -> None:
    assert speedups({1: 20.0, 4: 60.0, 16: 80.0}, {1: 10.0, 4: 30.0}) == {"1": 2.0, "4": 2.0}


def _method(
    name: str, tput: dict[int, float], spec_tau: float | None = None, status: str = "ok"
) -> MethodResult:
    levels = [level_stats(c, 1.0, [rec(int(t), 1 if spec_tau else 0)], 0) for c, t in tput.items()]
    spec = spec_stats([rec(int(spec_tau * 10), 10)], 3) if spec_tau else None
    return MethodResult(name, status, [], {}, levels if status == "ok" else [], spec)


def test_method_summary_and_summary_line() -> None:
    methods = {
        "nospec": _method("nospec", {1: 10, 4: 20}),
        "dflash": _method("dflash", {1: 25, 4: 30}, spec_tau=2.5),
        "ngram": _method("ngram", {1: 12, 4: 20}, spec_tau=1.2),
        "builtin": _method("builtin", {}, status="unavailable"),
    }
    s = method_summary(methods)
    assert s["tau"] == pytest.approx(2.5)
    assert s["speedup"] == {"1": pytest.approx(2.5), "4": pytest.approx(1.5)}
    assert s["ngram_speedup"] == {"1": pytest.approx(1.2), "4": pytest.approx(1.0)}
    assert s["builtin_tau"] is None and s["builtin_speedup"] == {}
    assert s["status"]["builtin"] == "unavailable"
    line = summary_line({**s, "x": 1 / 3}, digits=3)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["x"] == 0.333
    assert parsed["speedup"] == {"1": 2.5, "4": 1.5}


def test_summary_keys_exist_without_spec_methods() -> None:
    s = method_summary({"nospec": _method("nospec", {1: 10})})
    assert s["tau"] is None and s["speedup"] == {} and s["ngram_speedup"] == {}


def test_level_stats_is_frozen() -> None:
    lv = level_stats(1, 1.0, [rec(3)], 0)
    assert isinstance(lv, LevelStats)
    with pytest.raises(AttributeError):
        lv.wall_s = 2.0  # type: ignore[misc]


def test_round_robin_covers_categories_in_file_order() -> None:
    items = [("a", 1), ("a", 2), ("a", 3), ("b", 4), ("c", 5)]
    picked = round_robin(items, 4, key=lambda x: x[0])
    assert [i for _, i in picked] == [1, 4, 5, 2]
    assert len(round_robin(items, 0, key=lambda x: x[0])) == 5
    assert len(round_robin(items, 99, key=lambda x: x[0])) == 5


def test_list_flags() -> None:
    assert int_list("1, 4,16", "--concurrency") == (1, 4, 16)
    assert method_list("dflash,nospec,dflash") == ("dflash", "nospec")
    for bad in ("", "0", "a"):
        with pytest.raises(SystemExit):
            int_list(bad, "--concurrency")
    with pytest.raises(SystemExit):
        method_list("eagle")


def test_method_specs_args_and_env() -> None:
    specs = {s.name: s for s in method_specs(["nospec", "dflash", "ngram", "builtin"], "/d", 8, 6)}
    assert specs["nospec"].extra_args == () and specs["nospec"].positions == 0
    assert specs["dflash"].extra_args == (
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
        "--speculative-num-draft-tokens", "8",
    )  # fmt: skip
    assert specs["dflash"].env == {"DFLASH_SGLANG_WORKER": "ours"} and specs["dflash"].positions == 7
    assert specs["builtin"].env == {"DFLASH_SGLANG_WORKER": "builtin"} and specs["builtin"].optional
    assert specs["ngram"].extra_args[-1] == "6" and specs["ngram"].positions == 5
    with pytest.raises(ValueError):
        method_specs(["dflash"], None, 8, 6)


def test_failure_reason_prefers_the_exception_line() -> None:
    log = "\n".join([
        "[t] Prefill batch, #new-seq: 1",
        "[t] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "RuntimeError: unknown parameter type",
        "[t] Pyspy failed (py-spy dump). Error: not found",
        "x" * 5000 + " ValueError: huge dump line",
    ])
    assert failure_reason(log, RuntimeError("boom")) == "RuntimeError: unknown parameter type"
    assert failure_reason("[t] all fine\n[t] load failed", RuntimeError("boom")) == "[t] load failed"
    assert failure_reason("", TimeoutError("not healthy after 5s\nlog tail")) == "not healthy after 5s"


def test_missing_default_drafter_is_a_one_line_hint(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="random-drafter") as err:
        resolve_drafter(str(tmp_path / "nope"), ("nospec", "dflash"))
    assert "\n" not in str(err.value)
    assert resolve_drafter(None, ("nospec", "ngram")) is None  # no drafter needed


def test_adaptive_switches_are_read_from_the_log_after_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    old = "[x] dflash-sglang: adaptive block 16 for batch bucket 1 (decode step 9; ...)\n"
    log.write_text(old + "[y] dflash-sglang: adaptive block 8 for batch bucket 1 (decode step 30)\n"
                   "noise\n[z] dflash-sglang: adaptive block 1 for batch bucket 4 (decode step 41)\n")
    assert adaptive_switches(log, 0) == [(1, 16), (1, 8), (4, 1)]
    assert adaptive_switches(log, len(old)) == [(1, 8), (4, 1)]
    assert adaptive_switches(tmp_path / "missing.log", 0) == []


def test_adaptive_blocks_carry_over_levels_and_use_the_level_bucket() -> None:
    import dataclasses

    lv = [dataclasses.replace(level_stats(c, 1.0, [rec(4)] * n, 0), adaptive_switches=sw)
          for c, n, sw in ((1, 3, [(1, 4), (1, 16)]), (4, 4, [(4, 2), (2, 1), (4, 1)]), (16, 3, []))]
    # concurrency 16 with 3 requests: the batch never exceeds 3 -> bucket 4, chosen at level 4
    assert adaptive_blocks(lv) == {"1": 16, "4": 1, "16": 1}
    ours = MethodResult("dflash", "ok", [], {}, lv, None)
    assert method_summary({"dflash": ours})["adaptive_block"] == {"1": 16, "4": 1, "16": 1}
