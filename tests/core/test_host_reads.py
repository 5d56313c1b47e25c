"""count_host_reads counts the host reads of tensor values made in its region, and only those."""

from __future__ import annotations

import threading

import torch

from dflash_sglang.core.host_reads import count_host_reads


def test_counts_each_kind_and_restores_the_methods() -> None:
    t = torch.tensor([1, 2])
    before = {name: torch.Tensor.__dict__.get(name) for name in ("item", "__bool__", "tolist")}
    with count_host_reads() as n:
        t[0].item()
        t.tolist()
        if t.all():
            pass
        int(t[1])
        _ = t + 1  # device-side work is not a read
    assert n == {"item": 1, "tolist": 1, "__bool__": 1, "__int__": 1}
    assert n.sites == {"test_host_reads.py:test_counts_each_kind_and_restores_the_methods": 4}
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before
    with count_host_reads() as m:
        pass
    t[0].item()  # outside the region
    assert m.total() == 0


def test_other_threads_are_not_counted() -> None:
    t = torch.tensor(3)
    with count_host_reads() as n:
        th = threading.Thread(target=lambda: t.item())
        th.start()
        th.join()
        t.item()
    assert n["item"] == 1
