"""Describe the machine and software a benchmark ran on (recorded in results.json)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _cpuinfo_field(name: str) -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _accelerator() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver must not stop the description
        return None


def describe_machine() -> dict[str, Any]:
    """CPU model, cores, RAM, OS, interpreter, library versions and our git commit."""
    status = _git("status", "--porcelain")
    return {
        "cpu_model": _cpuinfo_field("model name") or platform.processor() or None,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": _mem_total_gib(),
        "accelerator": _accelerator(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "sglang": _version("sglang"),
        "transformers": _version("transformers"),
        "dflash_sglang": _version("dflash-sglang"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
    }


def finish_result(result: dict[str, Any], args: Any, out: str | None) -> None:
    """A benchmark script's last step: add its arguments and this machine's description, print the
    result without them (one JSON), and write it all to ``out`` (if given)."""
    import json
    from pathlib import Path

    full = {**result, "args": vars(args), "machine": describe_machine()}
    print(json.dumps(result, indent=1))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(full, indent=1) + "\n")
