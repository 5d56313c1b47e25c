"""Torch versions of the post-verify bookkeeping kernels in ``sglang.kernels.ops.speculative.eagle``.

- ``fill_accept_out_cache_loc_func(accept_index, out_cache_loc, accept_out_cache_loc, size)``:
  compact ``out_cache_loc[accept_index]`` over the entries != -1 (flat order) to the front.
- ``fill_bonus_tokens_func(accept_tokens, accept_lens, bonus_tokens, accept_stride, batch_size)``:
  ``bonus_tokens[b] = accept_tokens[b * accept_stride + accept_lens[b] - 1]``.
Both are Triton-only off CUDA/CPU-AMX builds; :func:`apply` REPLACEs them via SGLang's HookRegistry.
"""

from __future__ import annotations

import torch

from . import hook_replace, require_pinned

FILL_ACCEPT_TARGET = "sglang.kernels.ops.speculative.eagle.fill_accept_out_cache_loc_func"
FILL_BONUS_TARGET = "sglang.kernels.ops.speculative.eagle.fill_bonus_tokens_func"


def fill_accept_out_cache_loc_torch(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor, size: int
) -> None:
    flat = accept_index.reshape(-1)[:size].to(torch.int64)
    kept = flat[flat != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_torch(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
    batch_size: int,
) -> None:
    rows = torch.arange(batch_size, device=accept_lens.device, dtype=torch.int64)
    index = rows * accept_stride + accept_lens[:batch_size].to(torch.int64) - 1
    bonus_tokens[:batch_size] = accept_tokens.reshape(-1)[index].to(bonus_tokens.dtype)


def apply() -> None:
    require_pinned()
    hook_replace(FILL_ACCEPT_TARGET, fill_accept_out_cache_loc_torch)
    hook_replace(FILL_BONUS_TARGET, fill_bonus_tokens_torch)
