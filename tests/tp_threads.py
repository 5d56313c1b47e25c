"""Simulated tensor-parallel ranks for unit tests: threads whose all-gather meets at a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch


def run_ranks(tp: int, work: Callable[[int, Callable[[torch.Tensor], torch.Tensor]], object]) -> list:
    """work(rank, gather) on ``tp`` threads; gather concatenates every rank's tensor on the last dim."""
    barrier = threading.Barrier(tp)
    slots: list = [None] * tp
    results: list = [None] * tp

    def gather_for(rank: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def gather(t: torch.Tensor) -> torch.Tensor:
            slots[rank] = t
            barrier.wait()
            out = torch.cat(list(slots), dim=-1)
            barrier.wait()
            return out
        return gather

    def main(rank: int) -> None:
        results[rank] = work(rank, gather_for(rank))

    threads = [threading.Thread(target=main, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
