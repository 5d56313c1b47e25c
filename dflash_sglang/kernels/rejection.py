"""Chain speculative rejection sampling with caller-supplied uniforms, bit-exact with the reference.

Two launches, no host sync:
  1. grid (bs, C) over vocabulary chunks of BLOCK_V tokens. Every program recomputes its row's
     accept_len (B-1 gathered p/q values, cheap), builds its chunk of the bonus distribution
     (residual max(p - q, 0) after a rejection, p otherwise) in 2^-40 fixed point and writes the
     chunk's int64 sums of the residual and of p to a [bs, C] workspace. Chunk 0 writes accept_len.
  2. grid (bs,): totals, the fallback to p when the residual is empty, threshold
     T = floor(u * total), the chunk holding T (from the inclusive prefix of chunk sums), then a
     cumulative count inside that single chunk -> bonus; writes bonus and committed.
Integer sums are associative, so the parallel result equals ``kernel_ref.chain_rejection_ref`` bit
for bit whatever the reduction order; the float ops (u*q < p, p - q, *2^40, u*total in float64) are
single IEEE-rounded ops on both sides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dflash_sglang.core.kernel_ref import FIXED_POINT_SCALE
from dflash_sglang.core.verify import VerifyResult

from ._common import (
    FLOAT_DTYPES,
    INT_DTYPES,
    check_device,
    check_dtype,
    check_shape,
    check_valid_len,
    empty_accept_outputs,
    next_pow2,
)

NAME = "chain_rejection"
DEFAULT_BLOCK_V = 2048


@triton.jit
def _accept_len(
    b, block_ptr, tp_ptr, dp_ptr, u_ptr, vlen_ptr,
    B, V, s_blk_b, s_blk_i, s_tp_b, s_tp_r, s_dp_b, s_dp_r, s_u_b, s_u_i,
    HAS_VLEN: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """-> (accept_len, number of valid drafts) of request b."""
    if HAS_VLEN:
        vl = tl.minimum(tl.maximum(tl.load(vlen_ptr + b).to(tl.int32), 1), B)
    else:
        vl = B
    nd = vl - 1
    j = tl.arange(0, BLOCK_B)  # draft j sits at block position j+1, is checked against rows j
    dm = j < nd
    d = tl.load(block_ptr + b * s_blk_b + (j + 1) * s_blk_i, mask=dm, other=0).to(tl.int64)
    inr = dm & (d >= 0) & (d < V)
    p_d = tl.load(tp_ptr + b * s_tp_b + j * s_tp_r + d, mask=inr, other=0.0).to(tl.float32)
    q_d = tl.load(dp_ptr + b * s_dp_b + j * s_dp_r + d, mask=inr, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + b * s_u_b + j * s_u_i, mask=dm, other=1.0)
    reject = dm & ~(u * q_d < p_d)
    return tl.min(tl.where(reject, j, nd), axis=0), nd


@triton.jit
def _fixed_chunk(tp_ptr, dp_ptr, b, al, nd, offs, V, s_tp_b, s_tp_r, s_dp_b, s_dp_r, SCALE: tl.constexpr):
    """Fixed-point p and bonus-residual values of tokens `offs` in row accept_len (0 outside [0, V))."""
    vm = offs < V
    rejected = al < nd
    p = tl.load(tp_ptr + b * s_tp_b + al * s_tp_r + offs, mask=vm, other=0.0).to(tl.float32)
    p = tl.maximum(p, 0.0)
    q = tl.load(dp_ptr + b * s_dp_b + al * s_dp_r + offs, mask=vm & rejected, other=0.0).to(tl.float32)
    res = tl.where(rejected, tl.maximum(p - q, 0.0), p)
    return (p * SCALE).to(tl.int64), (res * SCALE).to(tl.int64)


@triton.jit
def _rejection_sums_kernel(
    block_ptr, tp_ptr, dp_ptr, u_ptr, vlen_ptr, acc_ptr, ws_res_ptr, ws_p_ptr,
    B, V, C, s_blk_b, s_blk_i, s_tp_b, s_tp_r, s_dp_b, s_dp_r, s_u_b, s_u_i,
    HAS_VLEN: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, SCALE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    al, nd = _accept_len(b, block_ptr, tp_ptr, dp_ptr, u_ptr, vlen_ptr, B, V, s_blk_b, s_blk_i,
                         s_tp_b, s_tp_r, s_dp_b, s_dp_r, s_u_b, s_u_i, HAS_VLEN, BLOCK_B)
    offs = c * BLOCK_V + tl.arange(0, BLOCK_V)
    p_fx, res_fx = _fixed_chunk(tp_ptr, dp_ptr, b, al.to(tl.int64), nd, offs, V,
                                s_tp_b, s_tp_r, s_dp_b, s_dp_r, SCALE)
    tl.store(ws_res_ptr + b * C + c, tl.sum(res_fx, axis=0))
    tl.store(ws_p_ptr + b * C + c, tl.sum(p_fx, axis=0))
    if c == 0:
        tl.store(acc_ptr + b, al.to(tl.int64))


@triton.jit
def _rejection_bonus_kernel(
    block_ptr, tp_ptr, dp_ptr, bu_ptr, vlen_ptr, acc_ptr, ws_res_ptr, ws_p_ptr, bonus_ptr, comm_ptr,
    B, V, C, s_blk_b, s_blk_i, s_tp_b, s_tp_r, s_dp_b, s_dp_r, s_comm_b,
    HAS_VLEN: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
    SCALE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    if HAS_VLEN:
        vl = tl.minimum(tl.maximum(tl.load(vlen_ptr + b).to(tl.int32), 1), B)
    else:
        vl = B
    al = tl.load(acc_ptr + b)
    ci = tl.arange(0, BLOCK_C)
    cm = ci < C
    s_res = tl.load(ws_res_ptr + b * C + ci, mask=cm, other=0)
    s_p = tl.load(ws_p_ptr + b * C + ci, mask=cm, other=0)
    use_p = tl.sum(s_res, axis=0) == 0  # empty residual -> sample from p
    sums = tl.where(use_p, s_p, s_res)
    total = tl.sum(sums, axis=0)
    u = tl.load(bu_ptr + b).to(tl.float64)
    thresh = (u * total.to(tl.float64)).to(tl.int64)
    incl = tl.cumsum(sums, axis=0)
    chunk = tl.sum((cm & (incl <= thresh)).to(tl.int32), axis=0)  # first chunk whose prefix passes T
    before = tl.sum(tl.where(ci < chunk, sums, 0), axis=0)
    offs = chunk.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)  # all >= V when chunk == C (degenerate)
    p_fx, res_fx = _fixed_chunk(tp_ptr, dp_ptr, b, al, vl - 1, offs, V, s_tp_b, s_tp_r, s_dp_b, s_dp_r, SCALE)
    w = tl.where(use_p, p_fx, res_fx)
    inside = tl.sum(((tl.cumsum(w, axis=0) + before) <= thresh).to(tl.int64), axis=0)
    bonus = tl.minimum(chunk.to(tl.int64) * BLOCK_V + inside, V - 1)
    tl.store(bonus_ptr + b, bonus)
    col = tl.arange(0, BLOCK_B)
    nxt = tl.load(block_ptr + b * s_blk_b + (col + 1) * s_blk_i, mask=col + 1 < B, other=-1).to(tl.int64)
    committed = tl.where(col < al, nxt, tl.where(col == al, bonus, -1))
    tl.store(comm_ptr + b * s_comm_b + col, committed, mask=col < B)


def chain_rejection(
    block_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
    valid_len: torch.Tensor | None = None,
    block_v: int = DEFAULT_BLOCK_V,
) -> VerifyResult:
    """Kernel of ``kernel_ref.chain_rejection_ref`` (same arguments and result, bit for bit).

    block_tokens [bs, B] int32/int64, target_probs [bs, B, V] and draft_probs [bs, B-1, V]
    float32/bf16/fp16 with contiguous last dim, uniforms [bs, B-1] and bonus_uniforms [bs] float32 in
    [0, 1), valid_len [bs] int (clamped to [1, B]). ``block_v`` (power of two) is the vocabulary chunk.
    """
    if block_tokens.dim() != 2 or block_tokens.shape[1] < 1:
        raise ValueError(f"{NAME}: block_tokens must be [bs, B] with B >= 1, got {tuple(block_tokens.shape)}")
    bs, block = block_tokens.shape
    if target_probs.dim() != 3:
        raise ValueError(f"{NAME}: target_probs must be [bs, B, V], got {tuple(target_probs.shape)}")
    vocab = target_probs.shape[-1]
    check_shape(NAME, "target_probs", target_probs, (bs, block, vocab), "[bs, B, V]")
    check_shape(NAME, "draft_probs", draft_probs, (bs, block - 1, vocab), "[bs, B-1, V]")
    check_shape(NAME, "uniforms", uniforms, (bs, block - 1), "[bs, B-1]")
    check_shape(NAME, "bonus_uniforms", bonus_uniforms, (bs,), "[bs]")
    check_dtype(NAME, "block_tokens", block_tokens, INT_DTYPES)
    check_dtype(NAME, "target_probs", target_probs, FLOAT_DTYPES)
    check_dtype(NAME, "draft_probs", draft_probs, FLOAT_DTYPES)
    check_dtype(NAME, "uniforms", uniforms, (torch.float32,))
    check_dtype(NAME, "bonus_uniforms", bonus_uniforms, (torch.float32,))
    if vocab < 1:
        raise ValueError(f"{NAME}: vocabulary size must be >= 1, got {vocab}")
    if target_probs.stride(-1) != 1 or draft_probs.stride(-1) != 1:
        raise ValueError(f"{NAME}: target_probs and draft_probs need a contiguous last dimension")
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"{NAME}: block_v must be a power of two >= 16, got {block_v}")
    tensors = {"block_tokens": block_tokens, "target_probs": target_probs, "draft_probs": draft_probs,
               "uniforms": uniforms, "bonus_uniforms": bonus_uniforms}
    check_valid_len(NAME, valid_len, bs, tensors)
    device = check_device(NAME, tensors)
    accept_len, bonus, committed = empty_accept_outputs(bs, block, device)
    if bs == 0:
        return VerifyResult(accept_len, bonus, committed, accept_len + 1)
    chunks = triton.cdiv(vocab, block_v)
    ws_res = torch.empty(bs, chunks, dtype=torch.int64, device=device)
    ws_p = torch.empty(bs, chunks, dtype=torch.int64, device=device)
    vlen = valid_len if valid_len is not None else accept_len  # dummy pointer when absent
    # An empty draft_probs ([bs, 0, V] when B == 1) is never read; any pointer will do.
    dp = draft_probs if draft_probs.numel() else target_probs
    s_dp = (draft_probs.stride(0), draft_probs.stride(1)) if draft_probs.numel() else (0, 0)
    s_u = (uniforms.stride(0), uniforms.stride(1)) if uniforms.numel() else (0, 0)
    u = uniforms if uniforms.numel() else bonus_uniforms
    common = dict(HAS_VLEN=valid_len is not None, BLOCK_B=next_pow2(block), BLOCK_V=block_v,
                  SCALE=FIXED_POINT_SCALE)
    warps = 8 if block_v >= 4096 else 4
    _rejection_sums_kernel[(bs, chunks)](
        block_tokens, target_probs, dp, u, vlen, accept_len, ws_res, ws_p,
        block, vocab, chunks, block_tokens.stride(0), block_tokens.stride(1),
        target_probs.stride(0), target_probs.stride(1), *s_dp, *s_u,
        num_warps=warps, **common,
    )
    _rejection_bonus_kernel[(bs,)](
        block_tokens, target_probs, dp, bonus_uniforms, vlen, accept_len, ws_res, ws_p, bonus, committed,
        block, vocab, chunks, block_tokens.stride(0), block_tokens.stride(1),
        target_probs.stride(0), target_probs.stride(1), *s_dp, committed.stride(0),
        BLOCK_C=next_pow2(chunks), num_warps=warps, **common,
    )
    return VerifyResult(accept_len=accept_len, bonus=bonus, committed=committed, num_committed=accept_len + 1)
