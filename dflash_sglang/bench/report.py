"""results.json and the PNG plots of a benchmark run.

The plots are drawn from the JSON object alone, so they can be redrawn from a saved results.json
(``write_plots(json.load(f), out_dir)``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .stats import MethodResult, method_summary

SCHEMA = "dflash-sglang-bench/1"
RESULTS_FILE = "results.json"
PLOTS = {
    "speedup": "speedup_vs_concurrency.png",
    "throughput": "throughput_vs_concurrency.png",
    "acceptance": "acceptance_by_position.png",
    "tau_by_category": "tau_by_category.png",
}


def method_json(result: MethodResult) -> dict[str, Any]:
    """One method's entry: numbers per concurrency level when measured, else status and reason."""
    out: dict[str, Any] = {"status": result.status}
    if result.status != "ok":
        out["reason"] = result.reason
    out.update(server_args=result.server_args, env=result.env, log=result.log, notes=result.notes or [])
    if result.levels:
        out["levels"] = {str(lv.concurrency): dataclasses.asdict(lv) for lv in result.levels}
    if result.status == "ok":
        out["spec"] = dataclasses.asdict(result.spec) if result.spec else None
    return out


def build_results(
    command: str, argv: list[str], machine: Mapping[str, Any], settings: Mapping[str, Any],
    methods: Mapping[str, MethodResult],
) -> dict[str, Any]:
    """The whole results.json object."""
    return {
        "schema": SCHEMA,
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "argv": argv,
        "machine": dict(machine),
        "settings": dict(settings),
        "methods": {name: method_json(m) for name, m in methods.items()},
        "summary": method_summary(methods),
        "plots": dict(PLOTS),
    }


def write_results(results: Mapping[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_FILE
    path.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def _ok_methods(results: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: m for n, m in results["methods"].items() if m["status"] == "ok" and m.get("levels")}


def _throughput(method: Mapping[str, Any]) -> dict[int, float]:
    return {int(c): lv["output_tokens_per_s"] for c, lv in method["levels"].items()}


def _concurrency_axis(ax: Any, concurrencies: set[int]) -> None:
    """Log-2 x axis with a plain tick at every measured concurrency."""
    ticks = sorted(concurrencies)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} measured", ha="center", va="center", transform=ax.transAxes)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def plot_speedup(results: Mapping[str, Any], path: Path) -> Path:
    """Tokens/s of each speculative method over no-spec tokens/s, per concurrency."""
    fig, ax = _figure()
    methods = _ok_methods(results)
    base = _throughput(methods["nospec"]) if "nospec" in methods else {}
    drawn: set[int] = set()
    for name, method in methods.items():
        tput = _throughput(method)
        xs = [c for c in sorted(tput) if base.get(c)]
        if name == "nospec" or not xs:
            continue
        ax.plot(xs, [tput[c] / base[c] for c in xs], marker="o", label=name)
        drawn.update(xs)
    if drawn:
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="no speculation")
        _concurrency_axis(ax, drawn)
        ax.legend()
    else:
        _no_data(ax, "speculative method with a no-spec baseline")
    ax.set(xlabel="concurrency (parallel requests)", ylabel="speedup (output tokens/s vs no-spec)",
           title="Speedup over no speculation")
    return _save(fig, path)


def plot_throughput(results: Mapping[str, Any], path: Path) -> Path:
    """Output tokens/s of every measured method, per concurrency."""
    fig, ax = _figure()
    methods = _ok_methods(results)
    for name, method in methods.items():
        tput = _throughput(method)
        xs = sorted(tput)
        ax.plot(xs, [tput[c] for c in xs], marker="o", label=name)
    if methods:
        _concurrency_axis(ax, {c for m in methods.values() for c in _throughput(m)})
        ax.legend()
    else:
        _no_data(ax, "method")
    ax.set(xlabel="concurrency (parallel requests)", ylabel="output tokens/s", title="Throughput")
    return _save(fig, path)


def plot_acceptance(results: Mapping[str, Any], path: Path) -> Path:
    """Fraction of verify steps accepting draft position j, per speculative method."""
    fig, ax = _figure()
    drawn = False
    for name, method in _ok_methods(results).items():
        rates = (method.get("spec") or {}).get("acceptance_by_position") or []
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=name)
            drawn = True
    if drawn:
        ax.set_ylim(0, 1.02)
        ax.legend()
    else:
        _no_data(ax, "speculative method")
    ax.set(xlabel="draft position in block", ylabel="acceptance rate", title="Acceptance by block position")
    return _save(fig, path)


def plot_tau_by_category(results: Mapping[str, Any], path: Path) -> Path:
    """Grouped bars: tau of each prompt category, one bar per speculative method."""
    fig, ax = _figure()
    per_method: dict[str, dict[str, float]] = {}
    for name, method in _ok_methods(results).items():
        taus = (method.get("spec") or {}).get("tau_by_category") or {}
        if taus:
            per_method[name] = taus
    cats = sorted({c for t in per_method.values() for c in t})
    width = 0.8 / max(len(per_method), 1)
    for i, (name, taus) in enumerate(per_method.items()):
        xs = [k + i * width for k in range(len(cats))]
        ax.bar(xs, [taus.get(c, 0.0) for c in cats], width=width, label=name)
    if per_method:
        ax.set_xticks([k + width * (len(per_method) - 1) / 2 for k in range(len(cats))], cats,
                      rotation=35, ha="right")
        ax.legend()
    else:
        _no_data(ax, "speculative method")
    ax.set(ylabel="tau (tokens per verify step)", title="Acceptance (tau) by prompt category")
    return _save(fig, path)


PLOTTERS = {
    "speedup": plot_speedup,
    "throughput": plot_throughput,
    "acceptance": plot_acceptance,
    "tau_by_category": plot_tau_by_category,
}


def write_plots(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [PLOTTERS[key](results, out_dir / name) for key, name in PLOTS.items()]
