"""Deterministic tests of the block verification rules (crafted logits / probabilities)."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.sampling import SamplingConfig, probs_from_logits
from dflash_sglang.core.verify import (
    VerifyResult,
    greedy_verify,
    rejection_verify,
    target_only_verify,
    verify,
)

V = 16


def _peaked_logits(target_ids: list[list[int]], vocab: int = V) -> torch.Tensor:
    """[bs, B, V] logits whose argmax at [b, i] is target_ids[b][i] (clear margin, no ties)."""
    ids = torch.tensor(target_ids, dtype=torch.int64)
    logits = torch.randn(*ids.shape, vocab, generator=torch.Generator().manual_seed(0))
    return logits.scatter(-1, ids.unsqueeze(-1), 10.0)


def _block(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def _one_hot_rows(ids: torch.Tensor, vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(ids, vocab).float()


def _assert_result(res: VerifyResult, accept_len: list[int], committed: list[list[int]]) -> None:
    assert res.accept_len.dtype == torch.int64 and res.bonus.dtype == torch.int64
    assert res.committed.dtype == torch.int64 and res.num_committed.dtype == torch.int64
    assert res.accept_len.tolist() == accept_len
    assert res.committed.tolist() == committed
    assert res.num_committed.tolist() == [a + 1 for a in accept_len]
    bonus_at = res.committed.gather(1, res.accept_len.view(-1, 1)).squeeze(1)
    assert torch.equal(bonus_at, res.bonus)


def test_greedy_all_accepted_takes_bonus_from_last_row() -> None:
    block = _block([[7, 1, 2, 3]])
    logits = _peaked_logits([[1, 2, 3, 9]])
    _assert_result(greedy_verify(block, logits), [3], [[1, 2, 3, 9]])


def test_greedy_first_draft_rejected() -> None:
    block = _block([[7, 1, 2, 3]])
    logits = _peaked_logits([[4, 2, 3, 9]])  # row 0 predicts 4 != draft 1; later matches don't count
    _assert_result(greedy_verify(block, logits), [0], [[4, -1, -1, -1]])


def test_greedy_ragged_batch_padding() -> None:
    block = _block([[0, 1, 2, 3], [0, 5, 6, 7], [0, 8, 9, 10]])
    logits = _peaked_logits([[1, 2, 11, 12], [5, 6, 7, 13], [14, 9, 10, 15]])
    res = greedy_verify(block, logits)
    _assert_result(res, [2, 3, 0], [[1, 2, 11, -1], [5, 6, 7, 13], [14, -1, -1, -1]])
    assert res.bonus.tolist() == [11, 13, 14]


def test_block_of_one_only_bonus() -> None:
    block = _block([[3], [4]])
    logits = _peaked_logits([[6], [2]])
    _assert_result(greedy_verify(block, logits), [0, 0], [[6], [2]])
    probs = _one_hot_rows(torch.tensor([[6], [2]]))
    empty_q = torch.zeros(2, 0, V)
    _assert_result(rejection_verify(block, empty_q, probs), [0, 0], [[6], [2]])
    _assert_result(target_only_verify(block, probs), [0, 0], [[6], [2]])
    cfg = SamplingConfig.uniform(2, temperature=1.0)
    _assert_result(
        verify(block, logits.scatter(-1, torch.tensor([[[6]], [[2]]]), 1e4), cfg), [0, 0], [[6], [2]]
    )


def test_rejection_point_masses_are_deterministic() -> None:
    # p rows are one-hot, so acceptance is certain (p(d) = 1) or impossible (p(d) = 0).
    block = _block([[0, 1, 2, 3], [0, 4, 5, 6]])
    target_ids = torch.tensor([[1, 2, 8, 9], [4, 10, 6, 11]])
    p = _one_hot_rows(target_ids)
    q = torch.full((2, 3, V), 1.0 / V)
    expected_committed = [[1, 2, 8, -1], [4, 10, -1, -1]]
    _assert_result(rejection_verify(block, q, p), [2, 1], expected_committed)
    _assert_result(target_only_verify(block, p), [2, 1], expected_committed)


def test_rejection_handles_zero_draft_prob_without_nan() -> None:
    # q(d) = 0 with p(d) > 0 must accept; p(d) = 0 must reject; nothing may produce NaN.
    block = _block([[0, 3, 4]] * 64)
    p = torch.zeros(64, 3, V)
    p[:, 0, 3] = 1.0  # p_0(d_1) = 1
    p[:, 1, 5] = 1.0  # p_1(d_2 = 4) = 0 -> always rejected, residual = p_1 -> token 5
    p[:, 2, 7] = 1.0
    q = torch.zeros(64, 2, V)
    q[:, 1, 4] = 1.0  # q_1(d_1 = 3) = 0 (all-zero row) and q_2(d_2) = 1
    res = rejection_verify(block, q, p, torch.Generator().manual_seed(1))
    assert res.accept_len.tolist() == [1] * 64
    assert res.bonus.tolist() == [5] * 64


def test_residual_all_zero_falls_back_to_target() -> None:
    # p_0 = q_1 exactly but p_0(d) = 0: rejection is forced and max(p - q, 0) has no mass.
    p = torch.zeros(32, 2, V)
    p[:, :, 2] = 1.0
    q = torch.zeros(32, 1, V)
    q[:, 0, 2] = 1.0
    block = _block([[0, 9]] * 32)  # d = 9 has p = 0 and q = 0
    res = rejection_verify(block, q, p, torch.Generator().manual_seed(2))
    assert res.accept_len.tolist() == [0] * 32
    assert res.bonus.tolist() == [2] * 32


def test_target_only_equals_rejection_with_one_hot_draft() -> None:
    gen = torch.Generator().manual_seed(3)
    bs, block_size = 512, 5
    target_probs = torch.softmax(torch.randn(bs, block_size, V, generator=gen), dim=-1)
    block = torch.randint(0, V, (bs, block_size), generator=gen)
    one_hot_q = _one_hot_rows(block[:, 1:])
    a = target_only_verify(block, target_probs, torch.Generator().manual_seed(11))
    b = rejection_verify(block, one_hot_q, target_probs, torch.Generator().manual_seed(11))
    for name in ("accept_len", "bonus", "committed", "num_committed"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert 0 < int(a.accept_len.sum()) and bool((a.accept_len < block_size - 1).any())


def test_mixed_greedy_and_sampled_batch() -> None:
    block = _block([[0, 5, 1], [0, 5, 1], [0, 5, 1]])
    logits = torch.full((3, 3, V), -1e4)
    logits[:, 0, 2] = 0.0  # row 0: tokens 2 and 5 equally likely; argmax (first max) is 2
    logits[:, 0, 5] = 0.0
    logits[:, 1, 1] = 0.0  # row 1: only token 1
    logits[:, 2, 9] = 0.0  # row 2: only token 9
    cfg = SamplingConfig(
        temperature=torch.tensor([0.0, 1.0, 0.0]),
        top_k=torch.tensor([1, 0, 0]),
        top_p=torch.tensor([0.1, 1.0, 1.0]),
    )
    q = probs_from_logits(logits[:, :2], SamplingConfig.uniform(3, temperature=1.0))  # q_j == p_{j-1}
    res = verify(block, logits, cfg, draft_probs=q, generator=torch.Generator().manual_seed(4))
    # Greedy rows reject 5 (argmax is 2); the sampled row has p(5)/q(5) = 1, so it accepts everything.
    _assert_result(res, [0, 2, 0], [[2, -1, -1], [5, 1, 9], [2, -1, -1]])
    res_no_q = verify(block, logits, cfg, generator=torch.Generator().manual_seed(4))
    greedy = greedy_verify(block, logits)
    for name in ("accept_len", "bonus", "committed"):
        assert torch.equal(getattr(res_no_q, name)[[0, 2]], getattr(greedy, name)[[0, 2]]), name


def test_temperature_zero_verify_equals_greedy_verify() -> None:
    gen = torch.Generator().manual_seed(5)
    bs, block_size = 256, 8
    logits = torch.randn(bs, block_size, V, generator=gen)
    block = logits.argmax(-1).roll(1, dims=1)  # drafts = target argmax of the previous row
    corrupt = torch.rand(bs, block_size, generator=gen) < 0.15
    block = torch.where(corrupt, torch.randint(0, V, (bs, block_size), generator=gen), block)
    cfg = SamplingConfig.uniform(bs, temperature=0.0, top_k=3, top_p=0.5)
    q = torch.softmax(torch.randn(bs, block_size - 1, V, generator=gen), dim=-1)
    expected = greedy_verify(block, logits)
    assert len(set(expected.accept_len.tolist())) > 3  # a genuinely ragged batch
    for draft_probs in (None, q):
        res = verify(block, logits, cfg, draft_probs=draft_probs, generator=torch.Generator().manual_seed(0))
        for name in ("accept_len", "bonus", "committed", "num_committed"):
            assert torch.equal(getattr(res, name), getattr(expected, name)), name


def test_shape_errors() -> None:
    with pytest.raises(ValueError):
        greedy_verify(_block([[0, 1]]), torch.zeros(1, 3, V))
    with pytest.raises(ValueError):
        rejection_verify(_block([[0, 1, 2]]), torch.zeros(1, 3, V), torch.zeros(1, 3, V))
