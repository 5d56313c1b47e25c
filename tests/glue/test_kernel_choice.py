"""The worker's kernel set is chosen once: torch on CPU; its greedy accept is core's greedy verify."""

from __future__ import annotations

import torch

from dflash_sglang.core.verify import greedy_verify
from dflash_sglang.glue.kernel_choice import choose_kernels


def test_cpu_gets_the_torch_set_and_it_verifies_like_core() -> None:
    ks = choose_kernels("cpu")
    assert ks.name == "torch"
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 6, 11, generator=g)
    block = torch.randint(0, 11, (5, 6), generator=g)
    block[:, 1:4] = logits.argmax(-1)[:, :3]  # some drafts right, so accept lengths vary
    block[1, 2] = (block[1, 2] + 1) % 11
    got, want = ks.greedy_accept(block, logits.argmax(-1)), greedy_verify(block, logits)
    for name in ("accept_len", "bonus", "committed", "num_committed"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert sorted(set(got.accept_len.tolist())) != [got.accept_len[0].item()]  # not all equal
