"""Context lookup drafts (core.lookup): what is proposed, where it lands in the block, and the stats."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.lookup import LookupConfig, LookupStats, lookup_continuation, overlay_lookup

CFG = LookupConfig(min_ngram=1, max_ngram=4)


def cont(history: list[int], length: int, cfg: LookupConfig = CFG) -> list[int]:
    return lookup_continuation(history, length, cfg)


def test_continues_the_most_recent_occurrence_of_the_longest_suffix() -> None:
    # suffix [1, 2] occurs at 0 (-> 7) and at 3 (-> 8): the most recent one wins
    assert cont([1, 2, 7, 1, 2, 8, 5, 1, 2], 2) == [8, 5]
    # the 1-gram [2] last occurred at 4 (-> 9), but the longer suffix [3, 2] (at 0, -> 6) is preferred
    assert cont([3, 2, 6, 0, 2, 9, 3, 2], 1) == [6]


def test_a_loop_is_continued_past_the_end_of_the_history() -> None:
    assert cont([5, 1, 2, 3, 1, 2, 3, 1], 7) == [2, 3, 1, 2, 3, 1, 2]
    assert cont([4, 4], 3) == [4, 4, 4]


def test_no_earlier_occurrence_or_too_short_a_suffix_gives_nothing() -> None:
    assert cont([1, 2, 3, 4], 5) == []
    assert cont([7], 5) == []
    # [9, 1] and [1] occurred before, but min_ngram 3 asks for a 3-token match
    assert cont([9, 1, 5, 9, 1], 2, LookupConfig(3, 4)) == []
    assert cont([9, 1, 5, 9, 1], 2, LookupConfig(2, 4)) == [5, 9]


def test_token_ids_are_matched_whole_not_as_bytes() -> None:
    # packed as 4-byte words, [256] is b"\x00\x01\x00\x00": the byte pattern of the suffix [1] occurs
    # inside [256, 0] one byte off a word boundary, which is not an occurrence of the token 1
    assert cont([256, 0, 5, 1], 2) == []
    assert cont([256, 0, 1, 9, 1], 2) == [9, 1]
    assert cont([70000, 123456, 3, 70000, 123456], 2) == [3, 70000]


def test_bad_ranges_are_refused() -> None:
    for lo, hi in [(0, 3), (3, 2)]:
        with pytest.raises(ValueError, match="n-gram range"):
            LookupConfig(lo, hi)


def test_overlay_places_tokens_and_one_hot_probabilities_only_where_a_match_exists() -> None:
    block = torch.tensor([[3, 90, 91, 92], [6, 80, 81, 82]])  # position 0: the last committed token
    probs = torch.full((2, 3, 10), 0.1)
    histories = [[1, 3, 4, 5, 3], [6]]  # row 0: [3] seen before -> 4 5 3; row 1: nothing to copy
    placed = overlay_lookup(block, probs, histories, CFG)
    assert placed == [3, 0]
    assert block.tolist() == [[3, 4, 5, 3], [6, 80, 81, 82]]
    assert torch.equal(probs[0].argmax(-1), torch.tensor([4, 5, 3]))
    assert torch.equal(probs[0].sum(-1), torch.ones(3)) and probs[0].max() == 1
    assert torch.equal(probs[1], torch.full((3, 10), 0.1))  # the drafter's q stays where it drafted


def test_overlay_leaves_single_token_blocks_alone() -> None:
    one = torch.tensor([[2]])
    assert overlay_lookup(one, None, [[2, 7, 2]], CFG) == [0] and one.tolist() == [[2]]


def test_stats_split_lookup_rows_from_drafter_rows() -> None:
    st = LookupStats()
    st.record([3, 0, 1], torch.tensor([4, 1, 2]))
    st.record([0, 0, 0], torch.tensor([2, 1, 1]))
    d = st.to_dict()
    assert (d["lookup_steps"], d["drafter_steps"]) == (2, 4)
    assert d["lookup_tau"] == 3.0 and d["drafter_tau"] == 5 / 4
