"""Torch versions of the packed req_to_token gather/scatter Triton kernels used on speculative paths.

Both kernels walk ``b in range(bs)`` over the window ``[start[b], end[b])`` of request row
``req_to_token[req_pool_indices[b]]`` and a *packed* flat buffer where request ``b`` starts at
``sum(end[:b] - start[:b])``:
- ``assign_extend_cache_locs``: gather the window into the packed buffer (verify write locations).
  Served through SGLang's own seam, ``SRTPlatform.get_speculative_cache_locs_fn``.
- ``fill_front_out_cache_loc``: the same gather with rows = requests of an equal-width window.
- ``assign_req_to_token_pool``: scatter the packed buffer into the window (new KV slots of a
  request). ``mem_cache/allocation.assign_req_to_token_pool_func`` has no seam for it on a
  non-Triton platform, so :func:`apply` REPLACEs it through SGLang's ``HookRegistry``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import hook_replace, require_pinned

ALLOCATION_TARGET = "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func"
FILL_FRONT_TARGET = "sglang.kernels.ops.speculative.cache_locs.fill_front_out_cache_loc_func"


def packed_window_index(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols), each [sum(end - start)] int64: element t of the packed buffer is
    ``req_to_token[rows[t], cols[t]]``."""
    lens = (end_offset - start_offset).to(torch.int64)  # [bs]
    owner = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)  # [T]
    first = torch.cumsum(lens, 0) - lens  # packed start of each request
    within = torch.arange(owner.numel(), device=lens.device) - first[owner]
    cols = start_offset.to(torch.int64)[owner] + within
    rows = req_pool_indices.to(torch.int64)[owner]
    return rows, cols


def assign_extend_cache_locs_torch(
    *,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
    device: Any,
) -> torch.Tensor:
    """[batch_size * draft_token_num] int64 packed gather of each request's window (rest zero)."""
    out = torch.zeros(batch_size * draft_token_num, dtype=torch.int64, device=device)
    rows, cols = packed_window_index(
        req_pool_indices[:batch_size], start_offset[:batch_size], end_offset[:batch_size]
    )
    out[: rows.numel()] = req_to_token[rows, cols].to(torch.int64)
    return out


def assign_req_to_token_pool_torch(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    batch_size: int,
) -> None:
    """Scatter the packed ``out_cache_loc`` into each request's ``[start, end)`` window, in place."""
    rows, cols = packed_window_index(
        req_pool_indices[:batch_size], start_offset[:batch_size], end_offset[:batch_size]
    )
    req_to_token[rows, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def fill_front_out_cache_loc_torch(
    num_front: torch.Tensor, out_cache_loc: torch.Tensor, front_out_cache_loc: torch.Tensor
) -> None:
    """Pack the first ``num_front[b]`` slots of request b's equal-width window of ``out_cache_loc``."""
    bs = num_front.numel()
    window = out_cache_loc.view(bs, -1)
    rows = torch.arange(bs, device=window.device)
    r, c = packed_window_index(rows, torch.zeros_like(num_front), num_front)
    front_out_cache_loc[: r.numel()] = window[r, c].to(front_out_cache_loc.dtype)


def apply() -> None:
    """REPLACE the Triton-only helpers via SGLang's HookRegistry (idempotent)."""
    require_pinned()
    hook_replace(ALLOCATION_TARGET, assign_req_to_token_pool_torch)
    hook_replace(FILL_FRONT_TARGET, fill_front_out_cache_loc_torch)
