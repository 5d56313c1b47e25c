"""Pure statistics of a benchmark run: percentiles, tau, per-position acceptance, category tables.

Nothing here talks to a server; every function takes plain records so the numbers can be checked
by hand (``tests/bench/test_bench_stats.py``).

Definitions (per method and concurrency level):

* output tokens/s = sum of ``completion_tokens`` / wall time of the whole level;
* TTFT = request sent -> first generated token received; TPOT = (latency - TTFT) / (tokens - 1);
* tau = sum ``completion_tokens`` / sum ``spec_verify_ct`` (tokens per target verify step);
* acceptance at draft position j = verify steps with >= j correct drafts / verify steps,
  from SGLang's ``spec_correct_drafts_histogram`` (index k: steps with exactly k correct drafts).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.adaptive import CostModel


@dataclass(frozen=True)
class RequestRecord:
    """One measured request, from the client's clock and the server's final ``meta_info``."""

    category: str  # prompt category (Spec-Bench's ``category`` field, or "all")
    prompt_tokens: int
    completion_tokens: int  # generated tokens, including the one produced by prefill
    ttft_s: float  # seconds: request sent -> first chunk carrying a generated token
    latency_s: float  # seconds: request sent -> last chunk
    verify_ct: int = 0  # target verify steps (0 without speculation)
    correct_hist: tuple[int, ...] = ()  # [k]: verify steps with exactly k correct drafts
    cached_tokens: int = 0  # prompt tokens served from the radix cache


@dataclass(frozen=True)
class Distribution:
    """Summary of one per-request quantity, in the unit named by the field holding it."""

    mean: float
    p50: float
    p90: float
    p99: float
    n: int  # number of values summarised


@dataclass(frozen=True)
class SpecStats:
    """Speculative-decoding acceptance of a set of requests."""

    tau: float  # tokens per verify step
    verify_steps: int  # sum of spec_verify_ct
    correct_drafts_histogram: list[int]  # [k]: verify steps with exactly k correct drafts
    acceptance_by_position: list[float]  # [j-1]: fraction of steps accepting draft position j
    tau_by_category: dict[str, float]  # category -> tau of its requests


@dataclass(frozen=True)
class LevelStats:
    """One method at one concurrency level."""

    concurrency: int  # client threads sending requests
    requests: int
    output_tokens: int  # sum of completion_tokens
    wall_s: float  # seconds from the first request sent to the last response finished
    output_tokens_per_s: float
    ttft_ms: Distribution
    tpot_ms: Distribution | None  # None when no request produced two tokens
    latency_ms: Distribution
    spec: SpecStats | None  # None without speculation
    # Our worker's adaptive block switches during this level, in order: [batch bucket, new block]
    # (from its log); None for methods without the policy.
    adaptive_switches: list[tuple[int, int]] | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default); ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution(values: Sequence[float], scale: float = 1.0) -> Distribution | None:
    """Mean and p50/p90/p99 of ``values`` times ``scale`` (e.g. 1000 for seconds -> ms)."""
    if not values:
        return None
    scaled = [v * scale for v in values]
    return Distribution(
        mean=sum(scaled) / len(scaled),
        p50=percentile(scaled, 50),
        p90=percentile(scaled, 90),
        p99=percentile(scaled, 99),
        n=len(scaled),
    )


def tpot_s(record: RequestRecord) -> float | None:
    """Seconds per output token after the first; None for a request with fewer than two tokens."""
    if record.completion_tokens < 2:
        return None
    return (record.latency_s - record.ttft_s) / (record.completion_tokens - 1)


def tau(records: Iterable[RequestRecord]) -> float | None:
    """Sum of completion tokens over sum of verify steps; None when nothing was verified."""
    tokens = steps = 0
    for r in records:
        tokens += r.completion_tokens
        steps += r.verify_ct
    return tokens / steps if steps else None


def merge_histograms(hists: Iterable[Sequence[int]]) -> list[int]:
    """Element-wise sum of histograms of different lengths (missing bins count 0)."""
    total: list[int] = []
    for h in hists:
        if len(h) > len(total):
            total.extend([0] * (len(h) - len(total)))
        for k, count in enumerate(h):
            total[k] += count
    return total


def acceptance_by_position(hist: Sequence[int], positions: int) -> list[float]:
    """[j-1] = steps with >= j correct drafts / all steps, for draft positions j = 1..positions."""
    steps = sum(hist)
    if steps == 0:
        return [0.0] * positions
    return [sum(hist[j:]) / steps for j in range(1, positions + 1)]


def tau_by_category(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Category -> tau of that category's requests (categories without verify steps are left out)."""
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        groups[r.category].append(r)
    out = {cat: tau(rs) for cat, rs in sorted(groups.items())}
    return {cat: t for cat, t in out.items() if t is not None}


def spec_stats(records: Sequence[RequestRecord], positions: int) -> SpecStats | None:
    """Acceptance of ``records``; ``positions`` = draft tokens per step (histograms may be shorter)."""
    t = tau(records)
    if t is None:
        return None
    hist = merge_histograms(r.correct_hist for r in records)
    positions = max(positions, len(hist) - 1)
    return SpecStats(
        tau=t,
        verify_steps=sum(r.verify_ct for r in records),
        correct_drafts_histogram=hist + [0] * (positions + 1 - len(hist)),
        acceptance_by_position=acceptance_by_position(hist, positions),
        tau_by_category=tau_by_category(records),
    )


def level_stats(
    concurrency: int, wall_s: float, records: Sequence[RequestRecord], positions: int
) -> LevelStats:
    """All numbers of one concurrency level; ``positions`` = 0 for a method without speculation."""
    if not records or wall_s <= 0:
        raise ValueError("a level needs at least one request and a positive wall time")
    tokens = sum(r.completion_tokens for r in records)
    tpots = [t for t in (tpot_s(r) for r in records) if t is not None]
    ttft = distribution([r.ttft_s for r in records], 1000.0)
    latency = distribution([r.latency_s for r in records], 1000.0)
    assert ttft is not None and latency is not None
    return LevelStats(
        concurrency=concurrency,
        requests=len(records),
        output_tokens=tokens,
        wall_s=wall_s,
        output_tokens_per_s=tokens / wall_s,
        ttft_ms=ttft,
        tpot_ms=distribution(tpots, 1000.0),
        latency_ms=latency,
        spec=spec_stats(records, positions) if positions > 0 else None,
    )


def speedups(method: Mapping[int, float], baseline: Mapping[int, float]) -> dict[str, float]:
    """Concurrency (as a string key) -> method tokens/s over baseline tokens/s, where both exist."""
    return {str(c): method[c] / baseline[c] for c in sorted(method) if baseline.get(c)}


def _rounded(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    return value


def summary_line(summary: Mapping[str, Any], digits: int = 4) -> str:
    """One JSON line (floats rounded) for the last line of stdout."""
    return json.dumps({k: _rounded(v, digits) for k, v in summary.items()}, separators=(", ", ": "))


@dataclass(frozen=True)
class MethodResult:
    """Everything measured (or the reason nothing was) for one serving method."""

    name: str  # "nospec" | "dflash" | "ngram" | "builtin"
    status: str  # "ok" | "unavailable" (optional method could not run) | "failed"
    server_args: list[str]  # appended to the launcher's base CPU arguments (BASE_SERVER_ARGS)
    env: dict[str, str]  # environment overrides given to the server
    levels: list[LevelStats]  # one per concurrency level measured, in order
    spec: SpecStats | None = None  # acceptance pooled over all levels (None without speculation)
    reason: str | None = None  # one log line when status != "ok"
    log: str | None = None  # server log file
    notes: list[str] | None = None  # non-fatal observations (e.g. a cache flush that failed)

    def tokens_per_s(self) -> dict[int, float]:
        return {lv.concurrency: lv.output_tokens_per_s for lv in self.levels} if self.status == "ok" else {}


def method_summary(methods: Mapping[str, MethodResult]) -> dict[str, Any]:
    """The summary object: tau and speedups over no-spec of every speculative method measured."""
    base = methods["nospec"].tokens_per_s() if "nospec" in methods else {}
    out: dict[str, Any] = {"tau": None, "speedup": {}, "ngram_speedup": {}}
    for name, result in methods.items():
        if name == "nospec":
            continue
        prefix = "" if name == "dflash" else f"{name}_"
        out[f"{prefix}tau"] = result.spec.tau if result.status == "ok" and result.spec else None
        out[f"{prefix}speedup"] = speedups(result.tokens_per_s(), base)
    if "dflash" in methods and methods["dflash"].status == "ok":
        out["adaptive_block"] = adaptive_blocks(methods["dflash"].levels)
    out["nospec_tokens_per_s"] = {str(c): v for c, v in sorted(base.items())}
    out["status"] = {name: result.status for name, result in methods.items()}
    return out


def adaptive_blocks(levels: Sequence[LevelStats]) -> dict[str, int | None]:
    """Concurrency -> the block our adaptive policy exploited for that concurrency's batch bucket at
    the end of the level (switches carry over from earlier levels; None: no policy or no switch)."""
    state: dict[int, int] = {}
    out: dict[str, int | None] = {}
    for lv in levels:
        for bucket, block in lv.adaptive_switches or ():
            state[bucket] = block
        out[str(lv.concurrency)] = state.get(CostModel.bucket(min(lv.concurrency, lv.requests)))
    return out
