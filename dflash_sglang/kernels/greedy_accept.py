"""Greedy accept / bonus over a ragged batch in one launch (one program per request).

Input choice: the kernel takes the target's argmax ids [bs, B], not logits. The argmax over a 152k
vocabulary is a bandwidth-bound reduction that ``torch.argmax`` already runs at roofline with a
split reduction over many SMs; fusing it into a one-program-per-request kernel would serialise each
row's 300 KB read on one SM. The wrapper accepts logits [bs, B, V] too and then calls torch.argmax
first (ties -> lowest id, as ``core.verify.greedy_verify``). What this kernel replaces is the chain
of ~10 tiny torch ops (compare, cumprod, sum, gather, cat, two where) that follows the argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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

NAME = "greedy_accept"


@triton.jit
def _greedy_accept_kernel(
    block_ptr, ids_ptr, vlen_ptr, acc_ptr, bonus_ptr, comm_ptr,
    B, s_blk_b, s_blk_i, s_ids_b, s_ids_i, s_comm_b,
    HAS_VLEN: tl.constexpr, BLOCK_B: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK_B)
    if HAS_VLEN:
        vl = tl.minimum(tl.maximum(tl.load(vlen_ptr + b).to(tl.int32), 1), B)
    else:
        vl = B
    # column k: draft at block position k+1 against target row k, for k < vl - 1.
    nxt = tl.load(block_ptr + b * s_blk_b + (col + 1) * s_blk_i, mask=col + 1 < vl, other=-1).to(tl.int64)
    ids = tl.load(ids_ptr + b * s_ids_b + col * s_ids_i, mask=col < vl, other=-1).to(tl.int64)
    reject = (col < vl - 1) & (nxt != ids)
    accept_len = tl.min(tl.where(reject, col, vl - 1), axis=0)
    bonus = tl.sum(tl.where(col == accept_len, ids, 0), axis=0)
    committed = tl.where(col < accept_len, nxt, tl.where(col == accept_len, bonus, -1))
    tl.store(acc_ptr + b, accept_len.to(tl.int64))
    tl.store(bonus_ptr + b, bonus)
    tl.store(comm_ptr + b * s_comm_b + col, committed, mask=col < B)


def greedy_accept(
    block_tokens: torch.Tensor,
    target: torch.Tensor,
    valid_len: torch.Tensor | None = None,
) -> VerifyResult:
    """Kernel of ``kernel_ref.greedy_accept_ref``.

    block_tokens [bs, B] int32/int64 ([:, 0] last committed, [:, 1:] drafts); target either the
    target argmax ids [bs, B] int32/int64 or logits [bs, B, V] float (argmax'ed by torch first);
    valid_len [bs] int32/int64, values clamped to [1, B]. Returns int64 accept_len [bs], bonus [bs],
    committed [bs, B] (padded -1) and num_committed [bs].
    """
    if block_tokens.dim() != 2 or block_tokens.shape[1] < 1:
        raise ValueError(f"{NAME}: block_tokens must be [bs, B] with B >= 1, got {tuple(block_tokens.shape)}")
    bs, block = block_tokens.shape
    check_dtype(NAME, "block_tokens", block_tokens, INT_DTYPES)
    if target.dim() == 3:
        check_shape(NAME, "target logits", target, (bs, block, target.shape[-1]), "[bs, B, V]")
        check_dtype(NAME, "target logits", target, FLOAT_DTYPES)
        check_device(NAME, {"block_tokens": block_tokens, "target": target})
        target = target.argmax(dim=-1)
    check_shape(NAME, "target ids", target, (bs, block), "[bs, B]")
    check_dtype(NAME, "target ids", target, INT_DTYPES)
    tensors = {"block_tokens": block_tokens, "target": target}
    check_valid_len(NAME, valid_len, bs, tensors)
    device = check_device(NAME, tensors)
    accept_len, bonus, committed = empty_accept_outputs(bs, block, device)
    if bs:
        _greedy_accept_kernel[(bs,)](
            block_tokens, target, valid_len if valid_len is not None else accept_len,
            accept_len, bonus, committed,
            block, block_tokens.stride(0), block_tokens.stride(1), target.stride(0), target.stride(1),
            committed.stride(0),
            HAS_VLEN=valid_len is not None, BLOCK_B=next_pow2(block), num_warps=1,
        )
    return VerifyResult(accept_len=accept_len, bonus=bonus, committed=committed, num_committed=accept_len + 1)
