"""Drafting over a vocabulary split across ranks equals drafting over the whole head.

The ranks run as threads whose all-gather meets at a barrier (``tp_threads``), so every rank computes
only from its own shard, as under tensor parallelism.
"""

from __future__ import annotations

import pytest
import torch
from tp_threads import run_ranks

from dflash_sglang.core.draft_head import DraftHead
from dflash_sglang.core.vocab_split import VocabSplit


@pytest.mark.parametrize("tp", [2, 3])
@pytest.mark.parametrize("subset", [False, True])
def test_split_argmax_and_gathered_logits_equal_the_whole_head(tp: int, subset: bool) -> None:
    torch.manual_seed(0)
    vocab, hidden = 48, 8
    lm_head = torch.randn(vocab, hidden)
    ids = torch.tensor([0, 3, 4, 9, 17, 18, 30, 31, 40, 47]) if subset else None
    x = torch.randn(5, 7, hidden)
    x[0, 0] = 0.0  # an all-tie row: the lowest token id wins, as argmax over the whole row
    whole = DraftHead.build(lm_head, ids, torch.float32)
    want_logits = x @ whole.weight.T
    want_tokens = whole.to_tokens(want_logits.argmax(-1))
    per = vocab // tp

    def work(rank: int, gather):  # noqa: ANN001, ANN202
        shard = torch.cat([lm_head[rank * per:(rank + 1) * per], torch.zeros(2, hidden)])  # + padding rows
        split = VocabSplit.build(shard, rank * per, (rank + 1) * per, vocab, ids, gather, torch.float32)
        local = x @ split.local.weight.T
        return split.argmax_tokens(local), split.gathered(local), split.whole.ids

    for tokens, logits, all_ids in run_ranks(tp, work):
        assert torch.equal(tokens, want_tokens)
        assert torch.equal(all_ids, whole.ids if ids is not None else torch.arange(vocab))
        torch.testing.assert_close(logits, want_logits)


def test_a_rank_without_draft_rows_still_agrees() -> None:
    lm_head = torch.randn(8, 4)
    ids = torch.tensor([5, 6])  # all on rank 1
    x = torch.randn(3, 4)

    def work(rank: int, gather):  # noqa: ANN001, ANN202
        split = VocabSplit.build(lm_head[rank * 4:(rank + 1) * 4], rank * 4, rank * 4 + 4, 8, ids, gather,
                                 torch.float32)
        return split.argmax_tokens(x @ split.local.weight.T)

    want = ids[(x @ lm_head[ids].T).argmax(-1)]
    assert all(torch.equal(t, want) for t in run_ranks(2, work))
