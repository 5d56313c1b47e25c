"""CommittedHistory: the committed output ahead of ``req.output_ids`` (overlap scheduler)."""

from __future__ import annotations

import gc

import torch

from dflash_sglang.glue.history import CommittedHistory


class Req:  # the one attribute the history reads, as SGLang's Req keeps it
    def __init__(self, output_ids: list[int]) -> None:
        self.output_ids = output_ids


def test_trail_runs_ahead_of_output_ids_as_under_overlap() -> None:
    a, b = Req([]), Req([])
    hist = CommittedHistory()
    hist.start([a, b], [0, 1], torch.tensor([5, 7]))
    # Overlap: decode step 1 runs before the prefill's result is processed.
    assert hist.outputs([a, b]) == [[5], [7]]
    hist.extend([a, b], [0, 1], torch.tensor([[9, 4, -1, -1], [8, -1, -1, -1]]), torch.tensor([2, 1]))
    a.output_ids += [5]  # the prefill's result is processed now, step 1's is not
    b.output_ids += [7]
    hist.extend([a, b], [0, 1], torch.tensor([[2, -1, -1, -1], [3, 6, -1, -1]]), torch.tensor([1, 2]))
    assert hist.outputs([a, b]) == [[5, 9, 4, 2], [7, 8, 3, 6]]
    a.output_ids += [9, 4]  # step 1 processed: output_ids stays a prefix of the trail
    assert hist.outputs([a, b])[0][: len(a.output_ids)] == a.output_ids


def test_untracked_requests_read_output_ids_and_trails_die_with_the_request() -> None:
    a, b = Req([1]), Req([])
    hist = CommittedHistory()
    hist.start([a, b], [1], torch.tensor([0, 6]))
    assert hist.outputs([a, b]) == [[1], [6]]
    del b
    gc.collect()
    assert len(hist._trails) == 0


def test_a_new_prefill_restarts_the_trail_from_output_ids() -> None:
    a = Req([])
    hist = CommittedHistory()
    hist.start([a], [0], torch.tensor([3]))
    hist.extend([a], [0], torch.tensor([[4, 1]]), torch.tensor([1]))  # the count cuts the row
    a.output_ids = [3, 4]  # e.g. retracted and re-prefilled with its output so far
    hist.start([a], [0], torch.tensor([8]))
    assert hist.outputs([a]) == [[3, 4, 8]]
