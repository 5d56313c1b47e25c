"""Keep glibc malloc from returning freed tensor memory to the kernel on every decode step.

Torch on CPU takes every tensor from ``malloc``. glibc serves blocks above its mmap threshold with
fresh ``mmap`` pages and hands the top of the heap back (``trim``) once more than the trim threshold
is free. A serving step allocates and frees tens of MiB per layer (gathered K/V, logits), so with
the defaults each step page-faults the same memory in again, in kernel time, and whether a given
process lands on that path depends on its heap history: measured on this project's 2-core host,
the no-speculation SmolLM2 scheduler at batch 12 with ~800-token contexts spent 57 s of 115 s CPU
in the kernel and decoded 10.5 tok/s; with the thresholds below, 9 s and 35.5 tok/s.

The fix is process-wide ``mallopt``: serve every block from the heap (no per-allocation mmap) and
trim only above ``TRIM_THRESHOLD_BYTES`` of free top-of-heap. Memory freed by a step is then reused
by the next one. ``DFLASH_SGLANG_MALLOC=default`` leaves glibc's settings alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
from dataclasses import dataclass

from ..settings import MALLOC_ENV, settings

logger = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 512 << 20  # free top-of-heap kept for the next step


@dataclass(frozen=True)
class AllocatorTuning:
    applied: bool
    reason: str  # why (not) applied, for the log


_result: AllocatorTuning | None = None


def tune_allocator() -> AllocatorTuning:
    """Apply the mallopt settings once per process (idempotent); returns what happened."""
    global _result
    if _result is not None:
        return _result
    mode = settings().malloc
    if mode == "default":
        _result = AllocatorTuning(False, f"{MALLOC_ENV}=default")
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _result = AllocatorTuning(False, "not glibc")
    else:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        _result = AllocatorTuning(ok, "mallopt: no per-allocation mmap, trim above 512 MiB" if ok
                                  else "mallopt refused the settings")
    logger.info("dflash-sglang: allocator %s (%s)", "tuned" if _result.applied else "unchanged",
                _result.reason)
    return _result
