"""Per-step tensor bookkeeping of the SGLang worker, separated from SGLang objects (shapes only)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.sampling import SamplingConfig


@dataclass(frozen=True)
class Block:
    """One decode step's block for every request in the batch."""

    tokens: torch.Tensor  # [bs, B] int64: committed (bonus) token, then B-1 mask tokens / drafts
    positions: torch.Tensor  # [bs, B] int64: prefix_len + j
    slots: torch.Tensor  # [bs, B] int64: KV slots reserved for the block (target and draft pools)


def make_block(bonus: torch.Tensor, prefix_lens: torch.Tensor, req_rows: torch.Tensor,
               req_to_token: torch.Tensor, mask_id: int, nb: int) -> Block:
    """bonus [bs], prefix_lens [bs] (committed KV length), req_rows [bs] -> Block."""
    offs = torch.arange(nb, device=bonus.device)
    positions = prefix_lens.long()[:, None] + offs  # [bs, B]
    slots = req_to_token[req_rows.long()[:, None], positions].long()
    tokens = torch.full_like(positions, mask_id)
    tokens[:, 0] = bonus
    return Block(tokens, positions, slots)


def extend_positions(prefix_lens: list[int], extend_lens: list[int], device: torch.device) -> torch.Tensor:
    """Absolute positions of every extend token, request after request: [sum(extend_lens)]."""
    starts = torch.tensor(prefix_lens, dtype=torch.long, device=device)
    lens = torch.tensor(extend_lens, dtype=torch.long, device=device)
    first = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    return torch.repeat_interleave(starts, lens) + torch.arange(int(lens.sum()), device=device) - first


def sampling_from_sglang(info, bs: int, device: torch.device) -> SamplingConfig:  # noqa: ANN001
    """SGLang's SamplingBatchInfo -> per-request SamplingConfig; top_k == 1 marks greedy rows."""
    if info is None or info.is_all_greedy:
        return SamplingConfig.uniform(bs, device=device)
    top_k = info.top_ks.to(device=device, dtype=torch.int64).view(-1)
    temperature = info.temperatures.to(device=device, dtype=torch.float32).view(-1)
    temperature = torch.where(top_k <= 1, torch.zeros_like(temperature), temperature)
    top_k = torch.where(top_k >= (1 << 30), torch.zeros_like(top_k), top_k)
    min_p = info.min_ps.to(device=device, dtype=torch.float32).view(-1) if info.need_min_p_sampling else None
    top_p = info.top_ps.to(device=device, dtype=torch.float32).view(-1)
    # SGLang's host flags answer "all greedy?" and "any filter?" without reading the tensors.
    any_filter = bool(info.need_top_p_sampling or info.need_top_k_sampling or info.need_min_p_sampling)
    return SamplingConfig(temperature, top_k, top_p, min_p, all_greedy=False, any_filter=any_filter)


def committed_rows(num_committed: torch.Tensor, nb: int) -> torch.Tensor:
    """[bs, B] bool: block rows whose tokens are now committed (their KV stays valid)."""
    return torch.arange(nb, device=num_committed.device)[None] < num_committed[:, None]
