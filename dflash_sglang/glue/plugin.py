"""SGLang general plugin (entry point group ``sglang.srt.plugins``): runs in every SGLang process.

* ``--speculative-algorithm DFLASH`` constructs OUR worker: an AROUND hook on
  ``SpeculativeAlgorithm.create_worker`` (the name DFLASH itself stays SGLang's, so every
  DFLASH-aware branch of the scheduler, KV sizing and tap capture keeps working).
  ``DFLASH_SGLANG_WORKER=builtin`` falls back to SGLang's built-in DFLASH worker.
* Prompts that would crash SGLang's scheduler (empty, token ids outside the vocabulary) get HTTP
  400 with or without speculation (``input_guard``).
* Our drafter class is registered as ``DFlashDraftModel`` in SGLang's model registry, so published
  DFlash checkpoints load into it.
"""

from __future__ import annotations

import logging
from typing import Any

from ..settings import WORKER_ENV, settings

logger = logging.getLogger(__name__)
CREATE_WORKER = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
HANDLE_DFLASH = "sglang.srt.arg_groups.speculative_hook._handle_dflash"


def use_builtin() -> bool:
    return settings().worker == "builtin"


def create_worker_hook(original: Any, algo: Any, *args: Any, **kwargs: Any) -> Any:
    if algo.is_dflash() and not use_builtin():
        from .worker import DFlashWorker

        return DFlashWorker
    return original(algo, *args, **kwargs)


def register() -> None:
    """Idempotent: SGLang calls plugins once per process."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from ..patches_guard import check_sglang_version
    from .input_guard import VALIDATE_ONE, validate_prompt_hook

    check_sglang_version()
    HookRegistry.register(VALIDATE_ONE, validate_prompt_hook, HookType.BEFORE)
    if use_builtin():
        logger.info("dflash-sglang: %s=builtin, SGLang's built-in DFLASH worker runs", WORKER_ENV)
        return
    HookRegistry.register(CREATE_WORKER, create_worker_hook, HookType.AROUND)
    HookRegistry.register(HANDLE_DFLASH, refuse_bad_pair_hook, HookType.AFTER)
    register_draft_model()


def register_draft_model() -> None:
    from sglang.srt.models.registry import ModelRegistry

    from .sglang_drafter import DFlashDraftModel

    ModelRegistry.models["DFlashDraftModel"] = DFlashDraftModel


def refuse_bad_pair_hook(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """After SGLang resolves the DFLASH server args (launcher process, before any model loads):
    a broken drafter or a drafter/target mismatch stops the launch with one line."""
    from ..core.config import DFlashConfigError
    from .pair_check import check_local_pair

    try:
        check_local_pair(server_args.model_path, server_args.speculative_draft_model_path)
    except DFlashConfigError as e:
        raise SystemExit(f"dflash-sglang: {e}") from None
    return result
