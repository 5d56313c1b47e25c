"""Sampling filters and statistical (seeded) checks that verification is lossless w.r.t. the target."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare

from dflash_sglang.core.sampling import SamplingConfig, probs_from_logits, sample_from_probs
from dflash_sglang.core.verify import VerifyResult, rejection_verify, target_only_verify, verify

N = 40_000  # draws per statistical check (vectorised as the batch dimension)
P_MIN = 1e-3  # chi-square p-value threshold


def _dist(values: list[float]) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float64)
    return (t / t.sum()).float()


def _chi2_pvalue(samples: torch.Tensor, p: torch.Tensor) -> float:
    """Goodness of fit of int samples to p; any draw of a p == 0 token gives p-value 0."""
    counts = torch.bincount(samples, minlength=p.numel()).double()
    support = p > 0
    if counts[~support].sum() > 0:
        return 0.0
    if int(support.sum()) == 1:  # a point mass: every draw landed on it
        return 1.0
    expected = p[support].double() / p[support].double().sum() * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


# (p0, q1): include tokens with q = 0 < p, p = 0 < q, p == q, disjoint supports and a point mass.
PAIRS = {
    "zeros_both_sides": (_dist([0.3, 0.2, 0.0, 0.25, 0.15, 0.1]), _dist([0.1, 0.4, 0.2, 0.0, 0.2, 0.1])),
    "equal": (_dist([0.1, 0.2, 0.3, 0.1, 0.2, 0.1]), _dist([0.1, 0.2, 0.3, 0.1, 0.2, 0.1])),
    "disjoint": (_dist([0.5, 0.5, 0, 0, 0, 0, 0]), _dist([0, 0, 0.25, 0.25, 0.25, 0.25, 0])),
    "target_point_mass": (_dist([0, 0, 0, 1, 0, 0, 0, 0]), _dist([1] * 8)),
    "draft_point_mass": (_dist([0.2, 0.3, 0.1, 0.4, 0.0]), _dist([0, 1, 0, 0, 0])),
    "skewed": (_dist([0.05, 0.05, 0.6, 0.1, 0.2, 0.0]), _dist([0.6, 0.05, 0.05, 0.2, 0.0, 0.1])),
}

VerifyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], VerifyResult]


def _run_block(
    verify_fn: VerifyFn, ps: list[torch.Tensor], qs: list[torch.Tensor], seed: int
) -> VerifyResult:
    """N rows of one block: drafts d_j ~ q_j, target rows ps (len B), draft rows qs (len B-1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.stack(qs).unsqueeze(0).expand(N, -1, -1)  # [N, B-1, V]
    p = torch.stack(ps).unsqueeze(0).expand(N, -1, -1)  # [N, B, V]
    drafts = sample_from_probs(q, gen)  # [N, B-1]
    block = torch.cat([torch.zeros(N, 1, dtype=torch.int64), drafts], dim=1)  # [N, B]
    return verify_fn(block, q, p, gen)


def _always_accept(
    block: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gen: torch.Generator
) -> VerifyResult:
    """Deliberately wrong rule: commit every draft (output follows q, not p)."""
    res = rejection_verify(block, q, p, gen)
    full = torch.full_like(res.accept_len, block.shape[1] - 1)
    return VerifyResult(accept_len=full, bonus=res.bonus, committed=block[:, 1:], num_committed=full + 1)


def _bonus_from_plain_target(
    block: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gen: torch.Generator
) -> VerifyResult:
    """Deliberately wrong rule: after a rejection draw from p instead of the residual max(p - q, 0)."""
    res = rejection_verify(block, q, p, gen)
    first = torch.where(res.accept_len > 0, block[:, 1], sample_from_probs(p[:, 0], gen))
    committed = res.committed.clone()
    committed[:, 0] = first
    return VerifyResult(res.accept_len, res.bonus, committed, res.num_committed)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_rejection_first_token_follows_target(name: str) -> None:
    p0, q1 = PAIRS[name]
    p1 = torch.roll(p0, 1)
    res = _run_block(rejection_verify, [p0, p1], [q1], seed=sorted(PAIRS).index(name))
    assert _chi2_pvalue(res.committed[:, 0], p0) > P_MIN
    accepted = res.accept_len == 1
    if name == "equal":
        assert bool(accepted.all())  # p == q: every draft is accepted
    if name == "disjoint":
        assert not bool(accepted.any())
    if int(accepted.sum()) > 1000:  # second token (the bonus after a full accept) follows p_1
        assert _chi2_pvalue(res.committed[accepted, 1], p1) > P_MIN


def test_rejection_three_position_block_is_lossless() -> None:
    p0, q1 = PAIRS["zeros_both_sides"]
    p1, q2 = PAIRS["skewed"]
    p2 = _dist([0.1, 0.0, 0.3, 0.2, 0.2, 0.2])
    res = _run_block(rejection_verify, [p0, p1, p2], [q1, q2], seed=7)
    assert _chi2_pvalue(res.committed[:, 0], p0) > P_MIN
    second = res.accept_len >= 1  # given the first draft was accepted, the next token follows p1
    assert _chi2_pvalue(res.committed[second, 1], p1) > P_MIN
    third = res.accept_len == 2
    assert int(third.sum()) > 1000
    assert _chi2_pvalue(res.committed[third, 2], p2) > P_MIN


@pytest.mark.parametrize("wrong_rule", [_always_accept, _bonus_from_plain_target])
def test_negative_control_wrong_rule_fails_the_check(wrong_rule: VerifyFn) -> None:
    p0, q1 = PAIRS["zeros_both_sides"]
    res = _run_block(wrong_rule, [p0, p0], [q1], seed=3)
    assert _chi2_pvalue(res.committed[:, 0], p0) < P_MIN
    good = _run_block(rejection_verify, [p0, p0], [q1], seed=3)
    assert _chi2_pvalue(good.committed[:, 0], p0) > P_MIN


def test_target_only_keeps_target_distribution_for_every_draft() -> None:
    p0 = _dist([0.3, 0.2, 0.0, 0.25, 0.15, 0.1])
    p1 = _dist([0.1, 0.1, 0.1, 0.1, 0.1, 0.5])
    vocab = p0.numel()
    per_draft = 8_000
    drafts = torch.arange(vocab).repeat_interleave(per_draft)  # every token, including p0 == 0
    block = torch.stack([torch.zeros_like(drafts), drafts], dim=1)  # [vocab * per_draft, 2]
    probs = torch.stack([p0, p1]).unsqueeze(0).expand(block.shape[0], -1, -1)
    res = target_only_verify(block, probs, torch.Generator().manual_seed(9))
    for d in range(vocab):
        rows = drafts == d
        assert _chi2_pvalue(res.committed[rows, 0], p0) > P_MIN, d
    assert not bool(res.accept_len[drafts == 2].any())  # p0(2) == 0: always rejected


def test_verify_end_to_end_with_filters_is_lossless() -> None:
    gen = torch.Generator().manual_seed(12)
    vocab = 7
    target_logits = torch.randn(1, 2, vocab, generator=gen).expand(N, -1, -1)
    draft_logits = torch.randn(1, 1, vocab, generator=gen).expand(N, -1, -1)
    cfg = SamplingConfig.uniform(N, temperature=0.8, top_k=5, top_p=0.9)
    q = probs_from_logits(draft_logits, cfg)  # [N, 1, V]
    p = probs_from_logits(target_logits[:1], SamplingConfig.uniform(1, temperature=0.8, top_k=5, top_p=0.9))
    block = torch.cat([torch.zeros(N, 1, dtype=torch.int64), sample_from_probs(q, gen)], dim=1)
    for draft_probs in (q, None):
        res = verify(block, target_logits, cfg, draft_probs=draft_probs, generator=gen)
        assert _chi2_pvalue(res.committed[:, 0], p[0, 0]) > P_MIN


def _reference_filter(logits: list[float], temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Slow, obviously-correct single-row reference for temperature + top-k + top-p."""
    scaled = torch.tensor(logits, dtype=torch.float64) / temperature
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    k = len(logits) if top_k <= 0 else min(top_k, len(logits))
    kept = order[:k]
    probs = torch.softmax(scaled[kept], dim=0).tolist()
    nucleus, mass = [], 0.0
    for tok, pr in zip(kept, probs, strict=True):
        nucleus.append(tok)
        mass += pr
        if mass >= top_p:
            break
    out = torch.zeros(len(logits), dtype=torch.float64)
    out[nucleus] = torch.softmax(scaled[nucleus], dim=0)
    return out.float()


ROW = [2.0, -1.0, 0.5, 3.0, 1.0, -2.0, 0.0]


def test_top_k_top_p_per_row_parameters() -> None:
    params = [(1.0, 0, 1.0), (1.0, 2, 1.0), (1.0, 0, 0.7), (2.0, 3, 0.9), (0.5, 7, 0.95), (1.0, 100, 1e-6)]
    cfg = SamplingConfig(
        temperature=torch.tensor([t for t, _, _ in params]),
        top_k=torch.tensor([k for _, k, _ in params]),
        top_p=torch.tensor([tp for _, _, tp in params]),
    )
    logits = torch.tensor([ROW] * len(params))
    probs = probs_from_logits(logits, cfg)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    for i, (t, k, tp) in enumerate(params):
        torch.testing.assert_close(probs[i], _reference_filter(ROW, t, k, tp), atol=1e-6, rtol=1e-5)
    assert torch.allclose(probs.sum(-1), torch.ones(len(params)))
    assert (probs[1] > 0).sum() == 2 and (probs[5] > 0).sum() == 1  # top-2 and a tiny nucleus
    assert int((probs[2] > 0).sum()) == 2  # sorted masses 0.60, 0.22, ...: two are needed to reach 0.7


def test_top_p_boundary_keeps_smallest_sufficient_set() -> None:
    # Dyadic probabilities are exact in float32, so the cumulative mass hits top_p exactly.
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]]).log().expand(4, -1)
    cfg = SamplingConfig(
        temperature=torch.ones(4),
        top_k=torch.zeros(4, dtype=torch.int64),
        top_p=torch.tensor([0.5, 0.75, 0.875, 0.0]),  # top_p = 0 still keeps the top token
    )
    probs = probs_from_logits(logits, cfg)
    assert ((probs > 0).sum(-1)).tolist() == [1, 2, 3, 1]
    torch.testing.assert_close(probs[1, :2], torch.tensor([2 / 3, 1 / 3]))


def test_probs_three_dims_apply_row_params_over_positions() -> None:
    cfg = SamplingConfig(
        temperature=torch.tensor([1.0, 0.7]), top_k=torch.tensor([3, 0]), top_p=torch.tensor([1.0, 0.8])
    )
    logits = torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(1))
    probs = probs_from_logits(logits, cfg)
    for b in range(2):
        for n in range(4):
            ref = _reference_filter(
                logits[b, n].tolist(), float(cfg.temperature[b]), int(cfg.top_k[b]), float(cfg.top_p[b])
            )
            torch.testing.assert_close(probs[b, n], ref, atol=1e-6, rtol=1e-5)


def test_temperature_zero_is_one_hot_argmax() -> None:
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(2))
    cfg = SamplingConfig(
        temperature=torch.tensor([0.0, 1.0, 0.0]),
        top_k=torch.tensor([2, 0, 0]),
        top_p=torch.tensor([0.3, 1.0, 1.0]),
    )
    probs = probs_from_logits(logits, cfg)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), 11).float()
    assert torch.equal(probs[[0, 2]], one_hot[[0, 2]])
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], -1))
    assert torch.equal(probs_from_logits(logits[:, 0], cfg)[[0, 2]], one_hot[[0, 2], 0])


def test_sample_from_probs_distribution_and_support() -> None:
    p = _dist([0.1, 0.0, 0.4, 0.2, 0.0, 0.3])
    samples = sample_from_probs(p.expand(N, -1), torch.Generator().manual_seed(5))
    assert samples.dtype == torch.int64 and samples.shape == (N,)
    assert _chi2_pvalue(samples, p) > P_MIN
    assert _chi2_pvalue(samples, _dist([0.2, 0.0, 0.3, 0.2, 0.0, 0.3])) < P_MIN  # the check has teeth
    assert sample_from_probs(p.expand(4, 3, -1)).shape == (4, 3)


def test_same_seed_same_samples() -> None:
    p0, q1 = PAIRS["skewed"]
    a = _run_block(rejection_verify, [p0, p0], [q1], seed=21)
    b = _run_block(rejection_verify, [p0, p0], [q1], seed=21)
    c = _run_block(rejection_verify, [p0, p0], [q1], seed=22)
    assert torch.equal(a.committed, b.committed) and torch.equal(a.accept_len, b.accept_len)
    assert not torch.equal(a.committed, c.committed)
    probs = p0.expand(1000, -1)
    s1 = sample_from_probs(probs, torch.Generator().manual_seed(1))
    assert torch.equal(s1, sample_from_probs(probs, torch.Generator().manual_seed(1)))


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability() -> None:
    # probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625: min_p 0.2 keeps p >= 0.1, min_p 0.5 keeps p >= 0.25
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]]).log().expand(4, -1)
    cfg = SamplingConfig(temperature=torch.ones(4), top_k=torch.tensor([0, 0, 0, 2]),
                         top_p=torch.ones(4), min_p=torch.tensor([0.0, 0.2, 0.5, 0.2]))
    probs = probs_from_logits(logits, cfg)
    assert ((probs > 0).sum(-1)).tolist() == [5, 3, 2, 2]
    torch.testing.assert_close(probs[1, :3], torch.tensor([4 / 7, 2 / 7, 1 / 7]))
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
