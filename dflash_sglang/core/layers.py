"""Small building blocks shared by the drafter: RMSNorm, RoPE, masked attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 statistics, rounded back to x.dtype, then * weight (Qwen3/Llama RMSNorm)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] int -> cos, sin [..., head_dim] (half-split layout, as Llama/Qwen)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.float()[..., None] * inv_freq  # [..., head_dim/2]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, heads, d]; cos/sin [..., n, d] broadcast over heads."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


def visibility_mask(
    q_pos: torch.Tensor,  # [bs, nq]
    k_pos: torch.Tensor,  # [bs, nk]
    k_valid: torch.Tensor,  # [bs, nk] bool
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    """[bs, 1, nq, nk] bool: which keys each query may attend to (positions are absolute)."""
    dq = q_pos[:, :, None] - k_pos[:, None, :]  # [bs, nq, nk]
    vis = k_valid[:, None, :].expand_as(dq).clone()
    if causal:
        vis &= dq >= 0
    if window is not None:
        vis &= dq < window
        if not causal:
            vis &= -dq < window
    return vis[:, None]


def masked_attention(
    q: torch.Tensor,  # [bs, nq, h, d]
    k: torch.Tensor,  # [bs, nk, kvh, d]
    v: torch.Tensor,  # [bs, nk, kvh, d]
    mask: torch.Tensor,  # [bs, 1, nq, nk] bool
    scale: float,
) -> torch.Tensor:
    """Grouped-query attention with a boolean mask -> [bs, nq, h, d]."""
    groups = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)
