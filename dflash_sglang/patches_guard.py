"""The exact SGLang version every hook and patch of this package was written against."""

from __future__ import annotations

PINNED_SGLANG = "0.5.23"


def check_sglang_version() -> None:
    import sglang

    if sglang.__version__ != PINNED_SGLANG:
        raise RuntimeError(
            f"dflash-sglang needs sglang=={PINNED_SGLANG} (found {sglang.__version__}); "
            f"pip install sglang=={PINNED_SGLANG}"
        )
