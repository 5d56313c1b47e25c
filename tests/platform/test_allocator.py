"""The platform's malloc tuning: freed step memory is reused instead of page-faulted in again."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

# A decode-step-like loop in a fresh process: allocate and free a 24 MiB tensor (one layer's
# gathered GQA keys at batch 12 x 830 positions) and a 40 MiB one (verify logits, 12 x 16 rows of a
# 49k vocabulary, fp32), and count the page faults of the loop.
PROBE = """
import json, resource, sys, torch
from dflash_sglang.platform.allocator import tune_allocator
result = tune_allocator() if sys.argv[1] == "tune" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # warm torch's own lazy state
    torch.ones(6 << 20).sum() + torch.ones(10 << 20).sum()
before = faults()
for _ in range(40):
    torch.ones(6 << 20).sum() + torch.ones(10 << 20).sum()  # 24 + 40 MiB, freed at once
print(json.dumps({"faults": faults() - before, "applied": result.applied if result else None}))
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)


def _probe(mode: str, env_value: str | None = None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("DFLASH_SGLANG_MALLOC", None)
    if env_value is not None:
        env["DFLASH_SGLANG_MALLOC"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_tuned_allocator_reuses_freed_step_memory() -> None:
    default = _probe("plain")
    tuned = _probe("tune")
    assert tuned["applied"] is True
    # Untuned glibc maps and faults in every block above its 32 MiB mmap ceiling anew (~10k pages
    # each); tuned, the heap keeps it (at most a one-time 16k-page growth was seen). Per iteration:
    # > 5000 pages vs. < 1000.
    assert int(default["faults"]) > 40 * 5000, default
    assert int(tuned["faults"]) < 40 * 1000, tuned


@glibc_only
def test_allocator_tuning_can_be_turned_off() -> None:
    off = _probe("tune", env_value="default")
    assert off["applied"] is False
    assert int(off["faults"]) > 40 * 5000, off


def test_allocator_env_rejects_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from dflash_sglang.platform import allocator
    from dflash_sglang.settings import settings

    monkeypatch.setattr(allocator, "_result", None)
    monkeypatch.setenv(allocator.MALLOC_ENV, "jemalloc")
    settings.cache_clear()
    with pytest.raises(ValueError, match="'tuned' or 'default'"):
        allocator.tune_allocator()


@glibc_only
def test_console_script_tunes_the_allocator() -> None:
    """``dflash-sglang train``/``generate`` run CPU tensor loops too: the CLI entry tunes malloc first."""
    code = ("from dflash_sglang import cli\nfrom dflash_sglang.platform import allocator\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('APPLIED', allocator._result.applied if allocator._result else None)")
    env = {k: v for k, v in os.environ.items() if k != "DFLASH_SGLANG_MALLOC"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "APPLIED True"
