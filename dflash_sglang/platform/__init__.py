"""A torch-native SGLang platform for CPUs without AVX-512/AMX (or any host without a GPU).

SGLang discovers it through the ``sglang.srt.platforms`` entry point ``dflash_cpu`` and uses it only
when ``SGLANG_PLATFORM=dflash_cpu``: :func:`activate` returns ``None`` otherwise, so installing this
package never changes what a GPU host runs.
"""

from __future__ import annotations

import os

PLATFORM_NAME = "dflash_cpu"
ATTENTION_BACKEND_NAME = "dflash_torch"
PLATFORM_CLASS = "dflash_sglang.platform.platform:DFlashCpuPlatform"


def activate() -> str | None:
    """Entry point: the platform's qualified class name when selected by name, else ``None``.

    Invariant: never imports SGLang or torch, so auto-discovery on other hosts stays free.
    """
    if os.environ.get("SGLANG_PLATFORM", "") != PLATFORM_NAME:
        return None
    return PLATFORM_CLASS
