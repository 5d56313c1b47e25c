"""The fused, chunked weighted cross-entropy equals plain autograd: loss, hits and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash_sglang.train.fused_ce import fused_weighted_ce


def _reference(h, weight, target, w, m):
    logits = m * (h @ weight.T)
    loss = (w * F.cross_entropy(logits, target, reduction="none")).sum()
    return loss, logits.argmax(-1) == target


@pytest.mark.parametrize("n,chunk,m", [(37, 8, 1.0), (64, 128, 0.7), (5, 1, 2.0)])
def test_fused_ce_equals_autograd(n: int, chunk: int, m: float) -> None:
    g = torch.Generator().manual_seed(n)
    weight = torch.randn(50, 16, generator=g)
    target = torch.randint(0, 50, (n,), generator=g)
    w = torch.rand(n, generator=g)
    h1 = torch.randn(n, 16, generator=g, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    want, want_hits = _reference(h1, weight, target, w, m)
    (3 * want).backward()
    got, hits = fused_weighted_ce(h2, weight, target, w, m, chunk)
    (3 * got).backward()  # the upstream gradient scales the stored one
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(hits, want_hits)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-4, atol=1e-5)


def test_fused_ce_checks_shapes_and_a_wrong_gradient_would_show() -> None:
    with pytest.raises(ValueError, match="expected"):
        fused_weighted_ce(torch.randn(3, 4), torch.randn(5, 6), torch.zeros(3, dtype=torch.long),
                          torch.ones(3))
    # negative control: the same check catches a gradient that is off by the softmax term
    h = torch.randn(6, 4, requires_grad=True)
    weight, target, w = torch.randn(9, 4), torch.randint(0, 9, (6,)), torch.ones(6)
    _reference(h, weight, target, w, 1.0)[0].backward()
    wrong = -(w[:, None] * weight[target])  # onehot term only
    assert not torch.allclose(h.grad, wrong, atol=1e-3)


@pytest.mark.parametrize("alpha,chunk", [(1.0, 8), (0.3, 128)])
def test_soft_labels_equal_cross_entropy_against_the_mixed_distribution(alpha: float, chunk: int) -> None:
    g = torch.Generator().manual_seed(7)
    n, m = 29, 0.9
    weight = torch.randn(40, 16, generator=g)
    target = torch.randint(0, 40, (n,), generator=g)
    w = torch.rand(n, generator=g)
    teacher = torch.randn(n, 16, generator=g)
    h1 = torch.randn(n, 16, generator=g, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    label = (1 - alpha) * F.one_hot(target, 40).float() + alpha * torch.softmax(m * teacher @ weight.T, -1)
    want = (w * F.cross_entropy(m * (h1 @ weight.T), label, reduction="none")).sum()
    want.backward()
    got, hits = fused_weighted_ce(h2, weight, target, w, m, chunk, teacher=teacher, alpha=alpha)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(hits, (h1 @ weight.T).argmax(-1) == target)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-4, atol=1e-5)
    hard, _ = fused_weighted_ce(h2.detach(), weight, target, w, m, chunk)
    assert not torch.allclose(hard, got)  # the teacher really changed the loss
