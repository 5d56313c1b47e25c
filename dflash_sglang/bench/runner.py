"""Run the benchmark: one SGLang server per method, one after another, each driven at every
concurrency level with the same prompts through streaming requests in a thread pool.

A method whose server fails to start, or whose first (warm-up) request or any measured request
fails, is recorded with ``status`` "unavailable" (optional methods: SGLang's built-in DFLASH
worker) or "failed" (the others) and the reason: one line from its server log.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import WORKER_ENV
from .client import Sampling, flush_cache, stream_generate
from .server import launch_sglang_server
from .stats import LevelStats, MethodResult, RequestRecord, level_stats, spec_stats

METHODS = ("nospec", "dflash", "ngram", "builtin")
OUR_WORKER_LOG_LINE = "dflash-sglang: our DFlash worker runs"
ADAPTIVE_SWITCH = re.compile(r"dflash-sglang: adaptive block (\d+) for batch bucket (\d+)")
EXCEPTION_LINE = re.compile(r"^([\w.]+(Error|Exception|Exit)|AssertionError)\b.*")
MAX_LOG_LINE = 2000  # longer log lines (SGLang's server_args dump) are never the reason
ERRORISH_LINE = re.compile(r"error|exception|not supported|unsupported|failed", re.IGNORECASE)


@dataclass(frozen=True)
class MethodSpec:
    """How to start the server of one method."""

    name: str
    extra_args: tuple[str, ...]  # appended to the launcher's base CPU arguments
    env: dict[str, str]  # environment overrides for the server process
    positions: int  # draft positions scored per verify step (0 = no speculation)
    optional: bool = False  # failure -> "unavailable" instead of failing the run


@dataclass(frozen=True)
class BenchPrompt:
    ids: tuple[int, ...]  # chat-templated prompt token ids
    category: str


@dataclass(frozen=True)
class Workload:
    """What every method is driven with."""

    prompts: tuple[BenchPrompt, ...]
    sampling: Sampling
    concurrency: tuple[int, ...]  # client threads per level, in run order
    request_timeout_s: float  # per request


@dataclass(frozen=True)
class ServerSetup:
    model_path: str  # target folder
    log_root: Path  # server logs go to <log_root>/<method>/
    startup_timeout_s: float
    threads: int | None = None  # OMP threads of each server (None: the launcher's default)
    common_args: tuple[str, ...] = ()  # extra arguments for every server


@dataclass
class Progress:
    """Anything with tqdm's ``update``/``set_description`` (a no-op stand-in by default)."""

    bar: Any = None
    done: int = field(default=0)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)


def dflash_args(drafter: str, block: int | None = None) -> tuple[str, ...]:
    """SGLang's launch flags for our DFLASH worker with ``drafter`` (block: the drafter's own if None);
    the one spelling shared by the bench, the demo and the server tests."""
    block_args = () if block is None else ("--speculative-num-draft-tokens", str(block))
    return ("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter, *block_args)


def method_specs(
    names: Sequence[str], drafter: str | None, block: int, ngram_tokens: int
) -> list[MethodSpec]:
    """Specs for ``names`` (a subset of METHODS), in the given order."""
    specs: list[MethodSpec] = []
    for name in names:
        if name == "nospec":
            specs.append(MethodSpec(name, (), {}, 0))
        elif name == "ngram":
            args = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(ngram_tokens))
            specs.append(MethodSpec(name, args, {}, ngram_tokens - 1))
        elif name in ("dflash", "builtin"):
            if drafter is None:
                raise ValueError(f"method {name!r} needs a drafter")
            worker = "ours" if name == "dflash" else "builtin"
            specs.append(MethodSpec(name, dflash_args(drafter, block), {WORKER_ENV: worker}, block - 1,
                                    optional=name == "builtin"))
        else:
            raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return specs


def failure_reason(log_text: str, err: BaseException) -> str:
    """One line: the last exception line of the log, else its last error-ish line, else ``err``."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip() and len(ln) < MAX_LOG_LINE]
    for pattern in (EXCEPTION_LINE, ERRORISH_LINE):
        hits = [ln for ln in lines if pattern.search(ln)]
        if hits:
            return hits[-1][:300]
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def _log_text(log_dir: Path) -> tuple[str, Path | None]:
    logs = sorted(log_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return "", None
    return logs[-1].read_text(errors="replace"), logs[-1]


def run_level(
    base_url: str, workload: Workload, concurrency: int, progress: Progress
) -> tuple[float, list[RequestRecord]]:
    """Send every prompt with ``concurrency`` threads; returns (wall seconds, records in prompt order)."""
    pool = ThreadPoolExecutor(max_workers=concurrency)
    start = time.perf_counter()
    try:
        futures: dict[Future[RequestRecord], int] = {
            pool.submit(stream_generate, base_url, list(p.ids), workload.sampling, p.category,
                        workload.request_timeout_s): i
            for i, p in enumerate(workload.prompts)
        }
        records: list[RequestRecord | None] = [None] * len(futures)
        for fut in as_completed(futures):
            records[futures[fut]] = fut.result()
            progress.update(1)
        wall = time.perf_counter() - start
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return wall, [r for r in records if r is not None]


def _warm_up(base_url: str, workload: Workload) -> None:
    """One short request: warms the server up and doubles as the first-request check."""
    first = workload.prompts[0]
    sampling = Sampling(min(8, workload.sampling.max_new_tokens), workload.sampling.temperature)
    stream_generate(base_url, list(first.ids), sampling, first.category, workload.request_timeout_s)


def _server_env(spec: MethodSpec, setup: ServerSetup) -> dict[str, str]:
    env = dict(spec.env)
    if setup.threads is not None:
        env["OMP_NUM_THREADS"] = str(setup.threads)
    return env


def run_method(spec: MethodSpec, workload: Workload, setup: ServerSetup, progress: Progress) -> MethodResult:
    """Start the method's server, warm it up, measure every level, stop it; never raises on failure."""
    log_dir = setup.log_root / spec.name
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _server_env(spec, setup)
    args = (*setup.common_args, *spec.extra_args)
    levels: list[LevelStats] = []
    records: list[RequestRecord] = []
    notes: list[str] = []
    owed = progress.done + len(workload.prompts) * len(workload.concurrency)  # progress at the end
    try:
        progress.describe(f"{spec.name}: starting server")
        with launch_sglang_server(args, model_path=setup.model_path, log_dir=log_dir, env=env,
                                  startup_timeout_s=setup.startup_timeout_s) as client:
            progress.describe(f"{spec.name}: warm-up")
            _warm_up(client.base_url, workload)
            log_offset = 0  # the first level's switches include the warm-up's
            for conc in workload.concurrency:
                if not flush_cache(client.base_url):
                    notes.append(f"radix cache flush before concurrency {conc} failed")
                progress.describe(f"{spec.name} c={conc}")
                wall, level_records = run_level(client.base_url, workload, conc, progress)
                level = level_stats(conc, wall, level_records, spec.positions)
                if spec.name == "dflash":
                    switches = adaptive_switches(client.log_path, log_offset)
                    level = dataclasses.replace(level, adaptive_switches=switches)
                log_offset = _log_size(client.log_path)
                levels.append(level)
                records.extend(level_records)
            notes.extend(_worker_notes(spec, client.log_path))
    except Exception as err:  # noqa: BLE001 - any failure of a method is recorded, not raised
        progress.update(owed - progress.done)
        log_text, log_path = _log_text(log_dir)
        status = "unavailable" if spec.optional else "failed"
        return MethodResult(spec.name, status, list(args), env, levels, None, failure_reason(log_text, err),
                            str(log_path) if log_path else None, notes)
    _, log_path = _log_text(log_dir)
    pooled = spec_stats(records, spec.positions) if spec.positions > 0 else None
    return MethodResult(spec.name, "ok", list(args), env, levels, pooled, None,
                        str(log_path) if log_path else None, notes)


def _worker_notes(spec: MethodSpec, log_path: Path) -> list[str]:
    if spec.name != "dflash":
        return []
    if OUR_WORKER_LOG_LINE in log_path.read_text(errors="replace"):
        return []
    return [f"server log lacks {OUR_WORKER_LOG_LINE!r}: was our worker really running?"]


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def adaptive_switches(log_path: Path, offset: int) -> list[tuple[int, int]]:
    """[(batch bucket, new block)] logged by our worker's adaptive policy after byte ``offset``."""
    if not log_path.is_file():
        return []
    with log_path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [(int(m.group(2)), int(m.group(1))) for m in ADAPTIVE_SWITCH.finditer(text)]
