"""Torch replacements for the Triton-only helpers SGLang 0.5.23 calls on speculative paths.

Each module owns one seam and exposes an idempotent ``apply()`` guarded by :func:`require_pinned`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from dflash_sglang.patches_guard import PINNED_SGLANG

# Modules under this package that install something with ``apply()``, in application order.
PATCH_MODULES: tuple[str, ...] = ("reconstruct_tree", "cache_locs", "accept_locs", "verify_tree")


def require_pinned() -> None:
    """Refuse to patch any SGLang other than the pinned one: symbols move between releases."""
    import sglang

    if sglang.__version__ != PINNED_SGLANG:
        got = sglang.__version__
        raise RuntimeError(f"dflash_sglang.platform patches target sglang {PINNED_SGLANG}, got {got}")


def hook_replace(target: str, replacement: Callable[..., Any]) -> None:
    """REPLACE ``target`` (dotted path) with ``replacement`` through SGLang's HookRegistry.

    Idempotent: registers once per process; ``apply_hooks`` skips already-patched targets and
    propagates the new binding to modules that did ``from module import name``.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not any(hook is replacement for _, hook, _ in HookRegistry._hooks.get(target, [])):
        HookRegistry.register(target, replacement, HookType.REPLACE)
    HookRegistry.apply_hooks()


def apply_all() -> None:
    for name in PATCH_MODULES:
        importlib.import_module(f"{__name__}.{name}").apply()
