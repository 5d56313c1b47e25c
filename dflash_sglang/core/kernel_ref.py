"""Pure-PyTorch references of the Triton kernels in the top-level ``kernels`` package.

Each function here has exactly the contract of its kernel (same inputs, same outputs, same handling
of padding and of out-of-range values) and is the definition the kernels are tested against.

1. :func:`context_kv_to_pool_ref` - context-KV materialization of the drafter. The caller fuses the
   context features ``c = hidden_norm(fc(taps))`` [N, H] and runs ONE GEMM for every layer's k/v
   projection (:func:`project_context_kv`, weights from :func:`stacked_kv_weights`), giving
   ``kv [N, L, 2, kvh, d]`` (index 0 = k, 1 = v). The reference/kernel then applies, per layer,
   k_norm (per-head RMSNorm) and half-split RoPE at ``positions [N]`` to k, and writes k and v
   into a paged pool at slots ``out_cache_loc [N]`` (slot < 0 = padding, skipped). The arithmetic
   is that of ``DFlashDrafter.context_kv`` op for op, including the roundings to the activation
   dtype between ops, so for identical ``kv`` the result is bit-identical to the drafter's.
2. :func:`greedy_accept_ref` - greedy acceptance over a ragged batch; equals
   ``core.verify.greedy_verify`` when every row uses the full block.
3. :func:`chain_rejection_ref` - speculative (chain) rejection sampling with caller-supplied
   uniforms, bonus drawn from the residual by an exact fixed-point inverse CDF (see below).

Ragged batches: ``valid_len[b]`` in [1, B] (values outside are clamped) says that only block
positions ``0 .. valid_len[b]-1`` of row b exist; the row is verified as if its block were truncated
there, and ``committed`` is padded with -1 to B columns as usual.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .layers import apply_rope, rms_norm, rope_cos_sin
from .verify import VerifyResult, leading_true_count, result_from_accept

# Fixed-point scale of the bonus sampler: residual probabilities are truncated to multiples of 2^-40.
FIXED_POINT_BITS = 40
FIXED_POINT_SCALE = float(2**FIXED_POINT_BITS)

KVPool = torch.Tensor | Sequence[torch.Tensor]  # [L, S, kvh, d] or L x [S, kvh, d]


# ---------------------------------------------------------------------------------------------------
# 1. context KV
# ---------------------------------------------------------------------------------------------------
def stacked_kv_weights(drafter: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """-> (w_kv [L*2*kvh*d, H], b_kv [L*2*kvh*d] or None, k_norm_weight [L, d]) of a DFlashDrafter.

    Rows are ordered layer-major, k before v, so ``F.linear(c, w_kv, b_kv).view(N, L, 2, kvh, d)``.
    """
    attns = [layer.self_attn for layer in drafter.layers]
    w = torch.cat([t for a in attns for t in (a.k_proj.weight, a.v_proj.weight)], dim=0)
    b = None
    if attns[0].k_proj.bias is not None:
        b = torch.cat([t for a in attns for t in (a.k_proj.bias, a.v_proj.bias)], dim=0)
    return w, b, torch.stack([a.k_norm.weight for a in attns])


def project_context_kv(
    c: torch.Tensor, w_kv: torch.Tensor, b_kv: torch.Tensor | None, num_layers: int, kv_heads: int
) -> torch.Tensor:
    """c [N, H] -> kv [N, L, 2, kvh, d]: every layer's k and v projection in one GEMM."""
    out = torch.nn.functional.linear(c, w_kv, b_kv)
    return out.view(c.shape[0], num_layers, 2, kv_heads, -1)


def context_k_v_ref(
    kv: torch.Tensor, k_norm_weight: torch.Tensor, positions: torch.Tensor, rope_theta: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv [N, L, 2, kvh, d] -> (k, v), each [N, L, kvh, d]; k normed and rotated, v untouched."""
    d = kv.shape[-1]
    k, v = kv[:, :, 0], kv[:, :, 1]
    w = k_norm_weight.to(kv.dtype)[None, :, None, :]  # [1, L, 1, d]; weight in activation dtype
    cos, sin = rope_cos_sin(positions, d, rope_theta, kv.dtype)  # [N, d]
    # apply_rope broadcasts cos[..., n, None, :] over heads: put L in front of N.
    k = apply_rope(rms_norm(k, w, eps).transpose(0, 1), cos, sin).transpose(0, 1)
    return k, v


def _pool_layers(pool: KVPool) -> list[torch.Tensor]:
    return list(pool.unbind(0)) if isinstance(pool, torch.Tensor) else list(pool)


def context_kv_to_pool_ref(
    kv: torch.Tensor,  # [N, L, 2, kvh, d]
    k_norm_weight: torch.Tensor,  # [L, d]
    positions: torch.Tensor,  # [N] int, absolute positions
    out_cache_loc: torch.Tensor,  # [N] int, pool slots; < 0 = skip
    k_pool: KVPool,
    v_pool: KVPool,
    rope_theta: float,
    eps: float,
) -> None:
    """Write k_norm+RoPE'd keys and raw values of N context tokens into the pools, in place."""
    k, v = context_k_v_ref(kv, k_norm_weight, positions, rope_theta, eps)
    keep = out_cache_loc >= 0
    loc = out_cache_loc[keep].long()
    for layer, (kp, vp) in enumerate(zip(_pool_layers(k_pool), _pool_layers(v_pool), strict=True)):
        kp[loc] = k[keep, layer].to(kp.dtype)
        vp[loc] = v[keep, layer].to(vp.dtype)


# ---------------------------------------------------------------------------------------------------
# 2. greedy accept
# ---------------------------------------------------------------------------------------------------
def _valid_len(valid_len: torch.Tensor | None, bs: int, block: int, device: torch.device) -> torch.Tensor:
    if valid_len is None:
        return torch.full((bs,), block, dtype=torch.int64, device=device)
    return valid_len.long().clamp(1, block)


def greedy_accept_ref(
    block_tokens: torch.Tensor,  # [bs, B] int: [last committed, B-1 drafts]
    target_ids: torch.Tensor,  # [bs, B] int: argmax of target row i (predicts block position i+1)
    valid_len: torch.Tensor | None = None,  # [bs] int in [1, B]
) -> VerifyResult:
    """accept_len = longest prefix of valid drafts equal to the target argmax; bonus = argmax at it."""
    bs, block = block_tokens.shape
    vl = _valid_len(valid_len, bs, block, block_tokens.device)
    col = torch.arange(block - 1, device=block_tokens.device).view(1, -1)
    ok = (block_tokens[:, 1:].long() == target_ids[:, :-1].long()) & (col < (vl - 1).view(-1, 1))
    accept_len = leading_true_count(ok)
    bonus = target_ids.long().gather(1, accept_len.view(-1, 1)).squeeze(1)
    return result_from_accept(block_tokens, accept_len, bonus)


# ---------------------------------------------------------------------------------------------------
# 3. chain rejection sampling
# ---------------------------------------------------------------------------------------------------
def to_fixed_point(x: torch.Tensor) -> torch.Tensor:
    """float32 probabilities (>= 0) -> int64 multiples of 2^-40, truncated (exact, order-free sums)."""
    return (x * FIXED_POINT_SCALE).long()


def inverse_cdf_fixed(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [bs, V] int64 >= 0, u [bs] float32 in [0, 1) -> [bs] int64 token.

    T = floor(float64(u) * float64(sum w)); token = #{t : cumsum(w)[t] <= T}, clamped to V-1. For a
    positive total this is the smallest t with cumsum(w)[t] > T, so P(token = t) = w[t] / sum(w) up to
    the 2^-53 rounding of the product; zero-weight tokens are never drawn. Integer sums make the result
    independent of summation order, which is what lets a parallel kernel reproduce it bit for bit.
    """
    total = weights.sum(dim=-1)
    threshold = (u.double() * total.double()).long()  # truncation == floor (non-negative)
    count = (weights.cumsum(dim=-1) <= threshold.view(-1, 1)).sum(dim=-1)
    return count.clamp(max=weights.shape[-1] - 1)


def _draft_probs_at(probs: torch.Tensor, drafts: torch.Tensor, in_range: torch.Tensor) -> torch.Tensor:
    idx = torch.where(in_range, drafts, 0).unsqueeze(-1)
    return torch.where(in_range, probs.gather(-1, idx).squeeze(-1).float(), 0.0)


def chain_rejection_ref(
    block_tokens: torch.Tensor,  # [bs, B] int
    target_probs: torch.Tensor,  # [bs, B, V] float, row i = p for block position i+1
    draft_probs: torch.Tensor,  # [bs, B-1, V] float, row j-1 = q the draft at position j came from
    uniforms: torch.Tensor,  # [bs, B-1] float32 in [0, 1), one per draft
    bonus_uniforms: torch.Tensor,  # [bs] float32 in [0, 1)
    valid_len: torch.Tensor | None = None,  # [bs] int in [1, B]
) -> VerifyResult:
    """Speculative rejection sampling with explicit randomness.

    Accept draft d_j (block position j) iff ``uniforms[:, j-1] * q_{j-1}(d_j) < p_{j-1}(d_j)`` in
    float32 (as ``core.verify``); accept_len = leading accepted count among the valid drafts; drafts
    outside [0, V) count as p = q = 0 (rejected). Bonus from row r = accept_len: after a rejection
    from max(max(p_r, 0) - q_r, 0), else from max(p_r, 0); if that residual is empty in fixed point,
    from max(p_r, 0). Sampled with :func:`inverse_cdf_fixed` and ``bonus_uniforms``.
    """
    bs, block = block_tokens.shape
    vocab = target_probs.shape[-1]
    device = block_tokens.device
    vl = _valid_len(valid_len, bs, block, device)
    n_drafts = vl - 1
    drafts = block_tokens[:, 1:].long()  # [bs, B-1]
    col = torch.arange(block - 1, device=device).view(1, -1)
    valid = col < n_drafts.view(-1, 1)
    in_range = valid & (drafts >= 0) & (drafts < vocab)
    p_d = _draft_probs_at(target_probs[:, :-1], drafts, in_range)  # [bs, B-1]
    q_d = _draft_probs_at(draft_probs, drafts, in_range)
    ok = (uniforms.float() * q_d < p_d) & valid
    accept_len = leading_true_count(ok)

    rows = torch.arange(bs, device=device)
    p_row = target_probs[rows, accept_len].float().clamp(min=0)  # [bs, V]
    p_fixed = to_fixed_point(p_row)
    if block > 1:
        rejected = (accept_len < n_drafts).view(-1, 1)
        q_row = draft_probs[rows, accept_len.clamp(max=block - 2)].float()
        res_fixed = to_fixed_point(torch.where(rejected, (p_row - q_row).clamp(min=0), p_row))
    else:
        res_fixed = p_fixed
    empty = (res_fixed.sum(dim=-1) == 0).view(-1, 1)
    bonus = inverse_cdf_fixed(torch.where(empty, p_fixed, res_fixed), bonus_uniforms)
    return result_from_accept(block_tokens, accept_len, bonus)
