"""Idempotent installation of the platform's pieces into a running SGLang process.

``register_choices`` only extends SGLang's CLI choice lists (safe while SGLang is still importing);
``install`` registers the attention backend and applies the Triton-free patches, and runs from
platform hooks that SGLang calls once it is fully imported (``apply_server_args_defaults`` in the
launcher, ``init_backend`` in each model worker).
"""

from __future__ import annotations

from dflash_sglang.platform import ATTENTION_BACKEND_NAME

_installed = False


def register_choices() -> None:
    """Let ``--attention-backend`` / ``--speculative-draft-attention-backend`` name our backend."""
    from sglang.srt.arg_groups import choices

    for name, extend in (
        ("ATTENTION_BACKEND_CHOICES", choices.add_attention_backend_choices),
        ("DRAFT_ATTENTION_BACKEND_CHOICES", choices.add_draft_attention_backend_choices),
    ):
        if ATTENTION_BACKEND_NAME not in getattr(choices, name):
            extend([ATTENTION_BACKEND_NAME])


def register_attention_backend() -> None:
    """Add ``dflash_torch`` to SGLang's attention-backend registry (idempotent)."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    from dflash_sglang.platform.attention import create_dflash_torch_backend

    register_attention_backend(ATTENTION_BACKEND_NAME)(create_dflash_torch_backend)


def install() -> None:
    """Register choices, backend and patches, and tune the allocator, once per process."""
    global _installed
    if _installed:
        return
    register_choices()
    register_attention_backend()
    from dflash_sglang.platform.allocator import tune_allocator

    tune_allocator()
    from dflash_sglang.platform.patches import apply_all

    apply_all()
    _installed = True
