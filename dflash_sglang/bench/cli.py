"""``dflash-sglang bench``: no-spec vs our DFLASH vs SGLang's NGRAM vs SGLang's built-in DFLASH.

Servers are started one after another on the same target and prompts; the last stdout line is a
JSON summary (tau, speedups over no-spec per concurrency); results.json and PNG plots go to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import shlex
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..settings import THREADS_ENV, settings
from .client import Sampling
from .machine import REPO
from .runner import (
    METHODS,
    BenchPrompt,
    MethodSpec,
    Progress,
    ServerSetup,
    Workload,
    method_specs,
    run_method,
)
from .server import BASE_SERVER_ARGS, OVERLAP_OFF, PLATFORM_NAME
from .stats import MethodResult, summary_line

DEFAULT_DRAFTER = REPO / "drafters" / "smollm2-135m-dflash-b16"
DEFAULT_CONCURRENCY = "1,4,16"
BASE_MAX_RUNNING = 16  # --max-running-requests in BASE_SERVER_ARGS


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark no-spec / DFLASH / NGRAM / built-in DFLASH SGLang servers")
    p.add_argument("--target", default=None, help="HF target folder (default: the embedded smollm2-135m)")
    p.add_argument("--drafter", default=None, help=f"DFlash drafter folder (default: {DEFAULT_DRAFTER})")
    p.add_argument("--block-size", type=int, default=16, help="--speculative-num-draft-tokens of DFLASH")
    p.add_argument("--prompts", default=None, help="prompts JSONL (default: Spec-Bench first turns)")
    p.add_argument("--limit", type=int, default=32,
                   help="number of prompts, taken round-robin over categories in file order (0: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help="comma-separated client thread counts")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--scheduler", choices=SCHEDULERS, default="overlap",
                   help="SGLang scheduler loop of every server; both: each method also runs as "
                        "<method>-no-overlap (speedups stay relative to nospec)")
    p.add_argument("--tp", default="1",
                   help="comma-separated tensor-parallel sizes; each size above 1 runs every method again as "
                        "<method>-tp<N> with --tp-size N (on the CPU the target's heads must divide by N: "
                        "`dflash-sglang models pad-heads`)")
    p.add_argument("--ngram-draft-tokens", type=int, default=8,
                   help="--speculative-num-draft-tokens of NGRAM")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="--dtype of every server (default: the launcher's float32; with bfloat16 a verify "
                        "block costs about one decode step on AVX-512 BF16 CPUs, where float32 GEMMs slow "
                        "down with the block's rows)")
    p.add_argument("--server-threads", type=int, default=None,
                   help=f"OMP threads per server (default: ${THREADS_ENV} or 1)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for a server to get healthy")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--out", default=None, help="output folder (default: benchmarks/out/<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run_bench)


SCHEDULERS = ("overlap", "no-overlap", "both")
DTYPES = ("float32", "bfloat16")  # float32: BASE_SERVER_ARGS' own


def common_server_args(concurrency: Sequence[int], dtype: str) -> tuple[str, ...]:
    """Arguments every server of the run gets: room for the largest concurrency, the model dtype."""
    args: tuple[str, ...] = ()
    if max(concurrency) > BASE_MAX_RUNNING:
        args += ("--max-running-requests", str(max(concurrency)))
    return args if dtype == "float32" else (*args, "--dtype", dtype)  # the last --dtype wins


def with_scheduler(specs: list[MethodSpec], scheduler: str) -> list[MethodSpec]:
    """The method specs under the chosen loop(s): overlap is SGLang's default, no-overlap adds its flag."""
    def off(spec: MethodSpec, name: str) -> MethodSpec:
        return dataclasses.replace(spec, name=name, extra_args=(*spec.extra_args, OVERLAP_OFF))

    if scheduler == "overlap":
        return specs
    if scheduler == "no-overlap":
        return [off(s, s.name) for s in specs]
    return [x for s in specs for x in (s, off(s, f"{s.name}-no-overlap"))]


def with_tp(specs: list[MethodSpec], sizes: Sequence[int]) -> list[MethodSpec]:
    """The method specs at each tensor-parallel size, TP 1 under the plain method name."""
    def at(spec: MethodSpec, tp: int) -> MethodSpec:
        if tp == 1:
            return spec
        return dataclasses.replace(spec, name=f"{spec.name}-tp{tp}",
                                   extra_args=(*spec.extra_args, "--tp-size", str(tp)))

    return [at(s, tp) for tp in sizes for s in specs]


def int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{what}: need at least one positive integer, got {text!r}")
    return values


def method_list(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise SystemExit(f"--methods: unknown {unknown or text!r}; choose from {','.join(METHODS)}")
    return names


def round_robin(items: Sequence[Any], limit: int, key: Any) -> list[Any]:
    """Up to ``limit`` items (0: all) taking one per category in turn, each category in file order."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    want = len(items) if limit <= 0 else min(limit, len(items))
    out: list[Any] = []
    depth = 0
    while len(out) < want:
        for group in groups.values():
            if depth < len(group) and len(out) < want:
                out.append(group[depth])
        depth += 1
    return out


def resolve_drafter(arg: str | None, methods: Sequence[str]) -> str | None:
    if not {"dflash", "builtin"} & set(methods):
        return arg
    path = Path(arg) if arg else DEFAULT_DRAFTER
    if not (path / "config.json").is_file():
        raise SystemExit(f"no DFlash drafter at {path}: pass --drafter DIR (e.g. from `dflash-sglang "
                         f"random-drafter --target T --out DIR`) or drop dflash,builtin from --methods")
    return str(path.resolve())


def load_bench_prompts(path: str | None, limit: int, target: str) -> tuple[BenchPrompt, ...]:
    from transformers import AutoTokenizer

    from ..prompts import chat_ids, load_prompts, spec_bench_path

    prompts = round_robin(load_prompts(path or spec_bench_path()), limit, key=lambda p: p.category)
    tok = AutoTokenizer.from_pretrained(target)
    return tuple(BenchPrompt(tuple(chat_ids(tok, p.text)), p.category) for p in prompts)


def default_out_dir() -> Path:
    root = REPO if (REPO / "pyproject.toml").is_file() else Path.cwd()
    return root / "benchmarks" / "out" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def command_line() -> str:
    if Path(sys.argv[0]).name == "dflash-sglang":
        return shlex.join(["dflash-sglang", *sys.argv[1:]])
    return shlex.join([Path(sys.executable).name, *sys.argv])


def settings_of(args: argparse.Namespace, target: str, drafter: str | None, workload: Workload,
                setup: ServerSetup, specs: Sequence[MethodSpec], tp_sizes: Sequence[int]) -> dict[str, Any]:
    return {
        "target": target,
        "drafter": drafter,
        "block_size": args.block_size,
        "prompts_file": args.prompts or "spec-bench (dflash_sglang.prompts.spec_bench_path)",
        "prompts": len(workload.prompts),
        "prompt_categories": dict(sorted(Counter(p.category for p in workload.prompts).items())),
        "prompt_tokens_total": sum(len(p.ids) for p in workload.prompts),
        "limit": args.limit,
        "max_new_tokens": workload.sampling.max_new_tokens,
        "temperature": workload.sampling.temperature,
        "ignore_eos": workload.sampling.ignore_eos,
        "concurrency": list(workload.concurrency),
        "methods": [s.name for s in specs],
        "ngram_draft_tokens": args.ngram_draft_tokens,
        "tp": list(tp_sizes),
        "server_threads": setup.threads or settings().server_threads,
        "dtype": args.dtype,
        "platform": PLATFORM_NAME,
        "base_server_args": [*BASE_SERVER_ARGS, *setup.common_args],
        "per_level": "one warm-up request per server, then the radix cache is flushed before every level",
    }


def human_table(results: list[MethodResult]) -> str:
    rows = ["method    conc   tok/s   TTFT p50 ms  TPOT p50 ms  lat p50/p90/p99 ms          tau  "
            "adaptive block switches (batch bucket -> block)"]
    for m in results:
        if m.status != "ok":
            rows.append(f"{m.name:<9} {m.status}: {m.reason}")
        for lv in m.levels:
            tpot = f"{lv.tpot_ms.p50:11.1f}" if lv.tpot_ms else f"{'-':>11}"
            tau = f"{lv.spec.tau:.2f}" if lv.spec else "-"
            lat = lv.latency_ms
            lats = f"{lat.p50:8.0f}/{lat.p90:8.0f}/{lat.p99:8.0f}"
            switches = " ".join(f"bs{b}->{k}" for b, k in lv.adaptive_switches or ())
            rows.append(f"{m.name:<9} {lv.concurrency:>4} {lv.output_tokens_per_s:7.1f} "
                        f"{lv.ttft_ms.p50:12.1f} {tpot}  {lats}  {tau:>6}  {switches}".rstrip())
    return "\n".join(rows)


def _progress_bar(total: int, disabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="req", file=sys.stderr, disable=disabled, dynamic_ncols=True)


def run_bench(args: argparse.Namespace) -> int:
    from ..models import fetch_model
    from .machine import describe_machine
    from .report import build_results, write_plots, write_results

    concurrency = int_list(args.concurrency, "--concurrency")
    tp_sizes = int_list(args.tp, "--tp")
    names = method_list(args.methods)
    drafter = resolve_drafter(args.drafter, names)
    target = str(args.target or fetch_model("smollm2-135m", log=lambda m: print(m, file=sys.stderr)))
    out_dir = Path(args.out) if args.out else default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    workload = Workload(load_bench_prompts(args.prompts, args.limit, target),
                        Sampling(args.max_new_tokens, args.temperature, args.ignore_eos),
                        concurrency, args.request_timeout)
    common = common_server_args(concurrency, args.dtype)
    setup = ServerSetup(target, out_dir / "logs", args.startup_timeout, args.server_threads, common)
    specs = with_tp(with_scheduler(method_specs(names, drafter, args.block_size, args.ngram_draft_tokens),
                                   args.scheduler), tp_sizes)
    bar = _progress_bar(len(specs) * len(concurrency) * len(workload.prompts), args.no_progress)
    measured: list[MethodResult] = []
    with bar:
        for spec in specs:
            result = run_method(spec, workload, setup, Progress(bar))
            measured.append(result)
            bar.set_description(f"{spec.name}: {result.status}")
            bar.write(f"{spec.name}: {result.status}" + (f" ({result.reason})" if result.reason else ""))
    results = build_results(command_line(), list(sys.argv), describe_machine(),
                            settings_of(args, target, drafter, workload, setup, specs, tp_sizes),
                            {m.name: m for m in measured})
    path = write_results(results, out_dir)
    write_plots(results, out_dir)
    print(human_table(measured))
    print(f"results: {path}")
    print(summary_line({**results["summary"], "results": str(path)}))
    return 1 if any(m.status == "failed" for m in measured) else 0
