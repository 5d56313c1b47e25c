"""Chain rejection sampling: kernel == reference bit for bit; the reference is statistically exact."""

from __future__ import annotations

import pytest
import torch
from kernel_test_helpers import gen
from scipy.stats import chi2

from dflash_sglang.core.kernel_ref import (
    FIXED_POINT_SCALE,
    chain_rejection_ref,
    inverse_cdf_fixed,
    to_fixed_point,
)
from dflash_sglang.core.verify import VerifyResult
from dflash_sglang.kernels import chain_rejection


def _probs(shape: tuple[int, ...], g: torch.Generator, temp: float = 1.0) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=g) / temp, dim=-1)


def _case(bs: int, block: int, vocab: int, seed: int, close: float = 0.8):
    """Draft q = mixture of p and noise (so acceptances happen), drafts sampled from q."""
    g = gen(seed)
    p = _probs((bs, block, vocab), g, temp=0.7)
    noise = _probs((bs, block - 1, vocab), g, temp=0.7)
    q = close * p[:, :-1] + (1 - close) * noise
    drafts = (
        torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(bs, block - 1)
        if block > 1
        else torch.zeros(bs, 0, dtype=torch.int64)
    )
    block_tokens = torch.cat([torch.randint(0, vocab, (bs, 1), generator=g), drafts], dim=1)
    u = torch.rand(bs, block - 1, generator=g)
    bu = torch.rand(bs, generator=g)
    valid = torch.randint(1, block + 1, (bs,), generator=g)
    return block_tokens, p, q, u, bu, valid


def _equal(a: VerifyResult, b: VerifyResult) -> None:
    for name in ("accept_len", "bonus", "committed", "num_committed"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == torch.int64 and torch.equal(x, y), (name, x, y)


@pytest.mark.parametrize(
    "bs,block,vocab,block_v",
    [(1, 1, 40, 16), (3, 2, 100, 32), (5, 8, 300, 64), (4, 16, 97, 16), (2, 4, 1000, 256)],
)
@pytest.mark.parametrize("ragged", [False, True])
def test_kernel_equals_reference_bit_for_bit(
    bs: int, block: int, vocab: int, block_v: int, ragged: bool
) -> None:
    block_tokens, p, q, u, bu, valid = _case(bs, block, vocab, seed=bs * 100 + block)
    vl = valid if ragged else None
    want = chain_rejection_ref(block_tokens, p, q, u, bu, vl)
    got = chain_rejection(block_tokens, p, q, u, bu, vl, block_v=block_v)
    _equal(got, want)


def test_kernel_edge_cases_bit_for_bit() -> None:
    """Accept-all rows, empty residual (q == p -> fall back to p), out-of-range ids, bf16 probs, int32."""
    bs, block, vocab = 6, 5, 70
    block_tokens, p, q, u, bu, valid = _case(bs, block, vocab, seed=9)
    q[0] = p[0, :-1]  # q == p: every draft accepted (u*q < p fails only if u >= 1)
    q[1, 0] = 2 * p[1, 0]  # q >= p everywhere: draft 1 rejected (u*q >= p), residual empty -> bonus ~ p
    u[1, 0] = 0.9
    block_tokens[2, 2] = vocab + 3  # out of range: rejected
    block_tokens[3, 1] = -1
    u[4] = 0.0  # accepts whenever p(d) > 0
    bu[5] = 0.0
    for args in (
        (block_tokens, p, q, u, bu, None),
        (block_tokens.int(), p.bfloat16(), q.half(), u, bu, valid.int()),
    ):
        want = chain_rejection_ref(*args)
        _equal(chain_rejection(*args, block_v=32), want)
    res = chain_rejection_ref(block_tokens, p, q, u, bu)
    assert int(res.accept_len[0]) == block - 1
    assert int(res.accept_len[2]) <= 1 and int(res.accept_len[3]) == 0


def test_kernel_non_contiguous_inputs() -> None:
    block_tokens, p, q, u, bu, _ = _case(4, 6, 50, seed=21)
    p_wide = torch.zeros(4, 6, 64)
    p_wide[..., :50] = p
    u_t = u.t().contiguous().t()  # column-major uniforms
    want = chain_rejection_ref(block_tokens, p, q, u, bu)
    _equal(chain_rejection(block_tokens, p_wide[..., :50], q, u_t, bu, block_v=16), want)


def test_inverse_cdf_fixed_point_rule() -> None:
    w = torch.tensor([[0, 3, 0, 5, 2]], dtype=torch.int64)  # cumsum 0 3 3 8 10
    cases = {0.0: 1, 0.29: 1, 0.3: 3, 0.79: 3, 0.8: 4, 0.9999: 4}
    for u, tok in cases.items():
        assert int(inverse_cdf_fixed(w, torch.tensor([u]))) == tok, u
    empty = torch.zeros(1, 4, dtype=torch.int64)
    assert int(inverse_cdf_fixed(empty, torch.tensor([0.5]))) == 3  # degenerate: clamps to V-1
    x = torch.tensor([1.0, 0.5, 2.0**-40, 2.0**-41, 0.0])
    assert to_fixed_point(x).tolist() == [2**40, 2**39, 1, 0, 0]
    assert FIXED_POINT_SCALE == 2.0**40


def _chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * samples.numel()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a zero-probability token"
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def test_reference_is_statistically_exact() -> None:
    """First committed token ~ p_0; second committed token, given the first draft was accepted, ~ p_1."""
    g = gen(123)
    vocab, block, n = 6, 3, 200_000
    p = torch.tensor(
        [
            [0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
            [0.05, 0.05, 0.10, 0.20, 0.25, 0.35],
            [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
        ]
    )
    q = torch.tensor(
        [
            [0.05, 0.10, 0.15, 0.20, 0.20, 0.30],  # q puts mass where p has none
            [0.30, 0.30, 0.10, 0.10, 0.10, 0.10],
        ]
    )
    drafts = torch.stack([torch.multinomial(q[j], n, replacement=True, generator=g) for j in range(2)], dim=1)
    block_tokens = torch.cat([torch.zeros(n, 1, dtype=torch.int64), drafts], dim=1)
    tp, dp = p.expand(n, block, vocab), q.expand(n, block - 1, vocab)
    u, bu = torch.rand(n, block - 1, generator=g), torch.rand(n, generator=g)
    res = chain_rejection_ref(block_tokens, tp, dp, u, bu)
    first = res.committed[:, 0]
    assert _chi_square_pvalue(first, p[0]) > 1e-3
    second = res.committed[res.accept_len >= 1, 1]
    assert _chi_square_pvalue(second, p[1]) > 1e-3
    # Power check: the same test rejects a sampler that draws the bonus from p instead of the residual.
    naive = torch.where(
        res.accept_len >= 1, drafts[:, 0], inverse_cdf_fixed(to_fixed_point(p[0]).expand(n, vocab), bu)
    )
    assert _chi_square_pvalue(naive, p[0]) < 1e-6


def test_kernel_statistics_small_batch() -> None:
    """The kernel on a few thousand rows gives the same draws as the reference (so the same law)."""
    g = gen(7)
    n, vocab = 300, 5
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]]).expand(n, 2, vocab)
    q = torch.tensor([[0.1, 0.1, 0.2, 0.3, 0.3]]).expand(n, 1, vocab)
    d = torch.multinomial(q[0], n, replacement=True, generator=g).view(n, 1)
    block_tokens = torch.cat([torch.zeros(n, 1, dtype=torch.int64), d], dim=1)
    u, bu = torch.rand(n, 1, generator=g), torch.rand(n, generator=g)
    got = chain_rejection(block_tokens, p, q, u, bu, block_v=16)
    _equal(got, chain_rejection_ref(block_tokens, p, q, u, bu))
    assert _chi_square_pvalue(got.committed[:, 0], p[0, 0]) > 1e-4


def _good():
    block_tokens, p, q, u, bu, valid = _case(2, 4, 10, seed=0)
    return dict(
        block_tokens=block_tokens,
        target_probs=p,
        draft_probs=q,
        uniforms=u,
        bonus_uniforms=bu,
        valid_len=valid,
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.update(block_tokens=a["block_tokens"][0]), r"block_tokens must be \[bs, B\]"),
        (lambda a: a.update(block_tokens=a["block_tokens"].float()), "block_tokens must be int32/int64"),
        (lambda a: a.update(target_probs=a["target_probs"][0]), r"target_probs must be \[bs, B, V\]"),
        (lambda a: a.update(target_probs=a["target_probs"][:, :3]), r"target_probs must be \[bs, B, V\]"),
        (lambda a: a.update(draft_probs=a["draft_probs"][..., :9]), r"draft_probs must be \[bs, B-1, V\]"),
        (lambda a: a.update(draft_probs=a["draft_probs"].double()), "draft_probs must be float32/float16/bf"),
        (lambda a: a.update(uniforms=a["uniforms"][:, :2]), r"uniforms must be \[bs, B-1\]"),
        (lambda a: a.update(uniforms=a["uniforms"].double()), "uniforms must be float32"),
        (lambda a: a.update(bonus_uniforms=a["bonus_uniforms"].half()), "bonus_uniforms must be float32"),
        (lambda a: a.update(bonus_uniforms=a["bonus_uniforms"][:1]), r"bonus_uniforms must be \[bs\]"),
        (lambda a: a.update(valid_len=a["valid_len"].float()), "valid_len must be int32/int64"),
        (
            lambda a: a.update(target_probs=a["target_probs"].transpose(0, 2).contiguous().transpose(0, 2)),
            "contiguous last dimension",
        ),
        (lambda a: a.update(block_v=48), "block_v must be a power of two"),
        (lambda a: a.update(uniforms=a["uniforms"].to("meta")), "all tensors must be on one device"),
    ],
)
def test_wrapper_rejects_bad_arguments(change, match: str) -> None:
    args = _good()
    change(args)
    with pytest.raises(ValueError, match=match) as err:
        chain_rejection(**args)
    assert "\n" not in str(err.value)
