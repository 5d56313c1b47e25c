"""Fused context-KV materialization: k_norm + RoPE on k, then K and V scattered into a paged pool.

What is fused and why. Per committed context token the drafter needs, for each of its L layers,
k = RoPE(k_norm(k_proj(c))) and v = v_proj(c) with c = hidden_norm(fc(taps)). The two GEMM stages
(fc, then all L k/v projections concatenated into ONE GEMM of width L*2*kvh*d, see
``kernel_ref.stacked_kv_weights``) stay on cuBLAS: they are compute bound and cuBLAS is at roofline.
Everything after the GEMM is memory bound and in eager PyTorch costs ~10 kernels and as many round
trips through HBM per layer (norm statistics, casts, rotate-half, two multiplies, an add, two index
writes). This kernel reads the GEMM output once and writes the pool once, for all layers in one launch.

Numerics: the kernel reproduces the PyTorch op sequence of ``DFlashDrafter.context_kv`` including
its intermediate roundings to the activation dtype (RMSNorm output, cos/sin, both RoPE products and
their sum), so it differs from the reference only by the fp32 rounding of the norm statistics and of
cos/sin (rarely one ulp of the activation dtype).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from dflash_sglang.core.kernel_ref import project_context_kv, stacked_kv_weights

from ._common import (
    FLOAT_DTYPES,
    INT_DTYPES,
    check_device,
    check_dtype,
    check_shape,
    next_pow2,
    round_mode,
    round_to,
)

NAME = "context_kv_to_pool"


@triton.jit
def _context_kv_kernel(
    kv_ptr, w_ptr, inv_freq_ptr, pos_ptr, loc_ptr, k_ptr, v_ptr,
    layer_base,
    s_kv_n, s_kv_l, s_kv_kv, s_kv_h,
    s_w_l,
    s_k_l, s_k_s, s_k_h,
    s_v_l, s_v_s, s_v_h,
    KVH, HALF, eps,
    ROUND: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    n = tl.program_id(0)
    lp = tl.program_id(1).to(tl.int64)  # layer inside this launch (pool layer index)
    layer = layer_base + lp  # layer of kv / k_norm weight
    slot = tl.load(loc_ptr + n).to(tl.int64)
    pos = tl.load(pos_ptr + n).to(tl.float32)

    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    m = (h < KVH) & (i < HALF)
    store_m = m & (slot >= 0)

    base = kv_ptr + n.to(tl.int64) * s_kv_n + layer * s_kv_l + h * s_kv_h
    k1 = tl.load(base + i, mask=m, other=0.0).to(tl.float32)
    k2 = tl.load(base + HALF + i, mask=m, other=0.0).to(tl.float32)
    v1 = tl.load(base + s_kv_kv + i, mask=m, other=0.0)
    v2 = tl.load(base + s_kv_kv + HALF + i, mask=m, other=0.0)

    # k_norm: per-head RMSNorm with fp32 statistics, rounded to the activation dtype, times weight.
    ms = (tl.sum(k1 * k1, axis=1) + tl.sum(k2 * k2, axis=1)) / (2 * HALF)
    r = (1.0 / tl.sqrt(ms + eps))[:, None]
    w1 = round_to(tl.load(w_ptr + layer * s_w_l + i, mask=i < HALF, other=0.0).to(tl.float32), ROUND)
    w2 = round_to(tl.load(w_ptr + layer * s_w_l + HALF + i, mask=i < HALF, other=0.0).to(tl.float32), ROUND)
    k1 = round_to(w1 * round_to(k1 * r, ROUND), ROUND)
    k2 = round_to(w2 * round_to(k2 * r, ROUND), ROUND)

    # Half-split RoPE: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], each product rounded.
    ang = pos * tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0)
    cos = round_to(tl.cos(ang), ROUND)
    sin = round_to(tl.sin(ang), ROUND)
    o1 = round_to(round_to(k1 * cos, ROUND) + round_to(-k2 * sin, ROUND), ROUND)
    o2 = round_to(round_to(k2 * cos, ROUND) + round_to(k1 * sin, ROUND), ROUND)

    kdst = k_ptr + lp * s_k_l + slot * s_k_s + h * s_k_h
    tl.store(kdst + i, o1.to(k_ptr.dtype.element_ty), mask=store_m)
    tl.store(kdst + HALF + i, o2.to(k_ptr.dtype.element_ty), mask=store_m)
    vdst = v_ptr + lp * s_v_l + slot * s_v_s + h * s_v_h
    tl.store(vdst + i, v1.to(v_ptr.dtype.element_ty), mask=store_m)
    tl.store(vdst + HALF + i, v2.to(v_ptr.dtype.element_ty), mask=store_m)


_INV_FREQ: dict[tuple[int, float, torch.device], torch.Tensor] = {}


def rope_inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """[d/2] float32, bit-identical to the frequencies of ``layers.rope_cos_sin`` (cached)."""
    key = (head_dim, float(theta), device)
    if key not in _INV_FREQ:
        exps = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
        _INV_FREQ[key] = 1.0 / (theta**exps)
    return _INV_FREQ[key]


def _as_layers(pool: torch.Tensor | Sequence[torch.Tensor], arg: str) -> list[torch.Tensor] | torch.Tensor:
    if isinstance(pool, torch.Tensor):
        if pool.dim() != 4:
            raise ValueError(f"{NAME}: {arg} must be [L, num_slots, kvh, d] or a list of [num_slots, kvh, d]")
        return pool
    pools = list(pool)
    if not pools or any(not isinstance(p, torch.Tensor) or p.dim() != 3 for p in pools):
        raise ValueError(f"{NAME}: {arg} must be [L, num_slots, kvh, d] or a list of [num_slots, kvh, d]")
    return pools


def context_kv_to_pool(
    kv: torch.Tensor,
    k_norm_weight: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    k_pool: torch.Tensor | Sequence[torch.Tensor],
    v_pool: torch.Tensor | Sequence[torch.Tensor],
    rope_theta: float,
    eps: float,
) -> None:
    """Kernel of ``kernel_ref.context_kv_to_pool_ref`` (same arguments, writes the pools in place).

    kv [N, L, 2, kvh, d] (k = [:, :, 0], v = [:, :, 1]; last dim contiguous, any other strides),
    k_norm_weight [L, d], positions [N] and out_cache_loc [N] int32/int64 (slot < 0: skipped),
    k_pool / v_pool either [L, num_slots, kvh, d] (one launch) or L tensors [num_slots, kvh, d]
    (one launch per layer), pool dtype == kv dtype. Duplicate slots: last writer wins (unspecified).
    """
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"{NAME}: kv must be [N, L, 2, kvh, d], got {tuple(kv.shape)}")
    n, layers, _, kvh, d = kv.shape
    if d % 2:
        raise ValueError(f"{NAME}: head_dim must be even for half-split RoPE, got {d}")
    kps, vps = _as_layers(k_pool, "k_pool"), _as_layers(v_pool, "v_pool")
    check_shape(NAME, "k_norm_weight", k_norm_weight, (layers, d), "[L, d]")
    check_shape(NAME, "positions", positions, (n,), "[N]")
    check_shape(NAME, "out_cache_loc", out_cache_loc, (n,), "[N]")
    check_dtype(NAME, "kv", kv, FLOAT_DTYPES)
    check_dtype(NAME, "k_norm_weight", k_norm_weight, FLOAT_DTYPES)
    check_dtype(NAME, "positions", positions, INT_DTYPES)
    check_dtype(NAME, "out_cache_loc", out_cache_loc, INT_DTYPES)
    if kv.stride(-1) != 1 or k_norm_weight.stride(-1) != 1:
        raise ValueError(f"{NAME}: kv and k_norm_weight need a contiguous last dimension")
    per_layer = not isinstance(kps, torch.Tensor)
    if per_layer != (not isinstance(vps, torch.Tensor)):
        raise ValueError(f"{NAME}: k_pool and v_pool must both be 4-D tensors or both lists")
    pk = kps if per_layer else [kps]
    pv = vps if per_layer else [vps]
    if len(pk) != len(pv) or (per_layer and len(pk) != layers):
        raise ValueError(f"{NAME}: need one k and one v pool per layer (L={layers}), got {len(pk)}/{len(pv)}")
    num_slots = pk[0].shape[-3]
    for arg, pools in (("k_pool", pk), ("v_pool", pv)):
        for p in pools:
            want = (num_slots, kvh, d) if per_layer else (layers, num_slots, kvh, d)
            if tuple(p.shape) != want:
                prefix = "L x " if per_layer else ""
                raise ValueError(f"{NAME}: {arg} must be {prefix}{want}, got {tuple(p.shape)}")
            if p.dtype != kv.dtype:
                raise ValueError(f"{NAME}: {arg} dtype {p.dtype} must equal kv dtype {kv.dtype}")
            if p.stride(-1) != 1:
                raise ValueError(f"{NAME}: {arg} needs a contiguous last dimension")
    tensors = {"kv": kv, "k_norm_weight": k_norm_weight, "positions": positions,
               "out_cache_loc": out_cache_loc}
    tensors.update({f"k_pool[{i}]": p for i, p in enumerate(pk)})
    tensors.update({f"v_pool[{i}]": p for i, p in enumerate(pv)})
    device = check_device(NAME, tensors)
    if n == 0:
        return
    inv_freq = rope_inv_freq(d, rope_theta, device)
    meta = dict(ROUND=round_mode(kv.dtype), BLOCK_H=next_pow2(kvh), BLOCK_HALF=next_pow2(d // 2))
    launches = [(i, pk[i], pv[i], 1) for i in range(layers)] if per_layer else [(0, kps, vps, layers)]
    for layer_base, kp, vp, nl in launches:
        s_k_l = kp.stride(0) if not per_layer else 0
        s_v_l = vp.stride(0) if not per_layer else 0
        _context_kv_kernel[(n, nl)](
            kv, k_norm_weight, inv_freq, positions, out_cache_loc, kp, vp,
            layer_base,
            kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
            k_norm_weight.stride(0),
            s_k_l, kp.stride(-3), kp.stride(-2),
            s_v_l, vp.stride(-3), vp.stride(-2),
            kvh, d // 2, float(eps),
            num_warps=4 if kvh * d >= 1024 else 2,
            **meta,
        )


def drafter_context_kv_to_pool(
    drafter: torch.nn.Module,
    taps: torch.Tensor,  # [N, T*H]
    positions: torch.Tensor,  # [N]
    out_cache_loc: torch.Tensor,  # [N]
    k_pool: torch.Tensor | Sequence[torch.Tensor],
    v_pool: torch.Tensor | Sequence[torch.Tensor],
    stacked: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None,
) -> None:
    """Whole context-KV path of a DFlashDrafter: fc + hidden_norm (torch), one k/v GEMM, the kernel.

    ``stacked`` = ``kernel_ref.stacked_kv_weights(drafter)``; pass it to avoid re-concatenating
    the weights on every call.
    """
    cfg = drafter.cfg
    w_kv, b_kv, k_norm_w = stacked if stacked is not None else stacked_kv_weights(drafter)
    c = drafter.fuse_context(taps)
    kv = project_context_kv(c, w_kv, b_kv, cfg.num_hidden_layers, cfg.num_key_value_heads)
    context_kv_to_pool(
        kv, k_norm_w, positions, out_cache_loc, k_pool, v_pool, cfg.rope_theta, cfg.rms_norm_eps
    )
