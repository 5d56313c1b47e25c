"""Reject prompts that would crash SGLang's scheduler, with HTTP 400, before they reach it.

SGLang 0.5.23 (with or without speculation) lets an empty prompt and token ids outside
[0, vocab_size) through to the scheduler, where they raise and take the server down. A BEFORE hook on
``TokenizerManager._validate_one_request`` (the method that already refuses over-long prompts with a
ValueError, answered as HTTP 400) refuses them the same way.
"""

from __future__ import annotations

from typing import Any

VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def prompt_error(input_ids: list[int] | None, vocab_size: int) -> str | None:
    """Why a tokenized prompt cannot be served, or None."""
    if input_ids is None:
        return None  # embeddings or multimodal input: SGLang validates those itself
    if len(input_ids) == 0:
        return "The prompt is empty: send at least one token (text or input_ids)."
    bad = next((t for t in input_ids if not isinstance(t, int) or t < 0 or t >= vocab_size), None)
    if bad is not None:
        return f"input_ids contains the token id {bad!r}, outside the vocabulary [0, {vocab_size})."
    return None


def validate_prompt_hook(manager: Any, obj: Any, input_ids: list[int] | None, *args: Any,
                         **kwargs: Any) -> None:
    """BEFORE hook: raise ValueError (HTTP 400) for a prompt the scheduler cannot take."""
    if getattr(obj, "input_embeds", None) is not None:
        return
    error = prompt_error(input_ids, int(manager.model_config.vocab_size))
    if error is not None:
        raise ValueError(error)
