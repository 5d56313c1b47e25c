"""Preconditioned fc: same function, unit-scale inputs for the optimiser, a plain fc in the checkpoint."""

from __future__ import annotations

import torch

from dflash_sglang.core.drafter import DFlashDrafter
from dflash_sglang.train.precondition import is_preconditioned, precondition, published, tap_scales

from .tiny import tiny_drafter, tiny_model


def test_precondition_keeps_the_function_and_publishes_a_plain_fc(tmp_path) -> None:
    torch.manual_seed(0)
    d = tiny_drafter(tiny_model()).float()
    x = torch.randn(50, d.fc.in_features)
    x[:, 3] *= 1000.0  # a massive activation, as SmolLM2's dimension 507
    before = d.fuse_context(x)
    scale = tap_scales([x])
    assert torch.allclose((x * scale).pow(2).mean(0).sqrt(), torch.ones(x.shape[1]), atol=1e-3)
    precondition(d, scale)
    assert is_preconditioned(d)
    torch.testing.assert_close(d.fuse_context(x), before, rtol=1e-5, atol=1e-5)
    # the optimiser's parameter is W' = W / scale: the outlier column is large, not tiny
    original = d.fc.parametrizations.weight.original
    assert original[:, 3].abs().mean() > 100 * d.fc.weight[:, 3].abs().mean()
    plain = published(d)
    assert not is_preconditioned(plain) and set(plain.state_dict()) == set(DFlashDrafter(d.cfg).state_dict())
    torch.testing.assert_close(plain.fuse_context(x), before, rtol=1e-5, atol=1e-5)
    plain.save_pretrained(tmp_path / "ckpt")
    torch.testing.assert_close(DFlashDrafter.from_pretrained(tmp_path / "ckpt").fuse_context(x), before,
                               rtol=1e-5, atol=1e-5)


def test_adam_on_an_outlier_column_moves_the_output_less_when_preconditioned() -> None:
    """One Adam step of lr 1e-3 on a random loss: with a 1000x input dimension the plain fc's output moves
    ~1000x lr; preconditioned, about lr per unit-scale input."""
    torch.manual_seed(1)
    x = torch.randn(64, 8)
    x[:, 0] *= 1000.0

    def output_shift(pre: bool) -> float:
        lin = torch.nn.Linear(8, 4, bias=False)
        if pre:
            from torch.nn.utils import parametrize

            from dflash_sglang.train.precondition import ScaledColumns

            parametrize.register_parametrization(lin, "weight", ScaledColumns(tap_scales([x])))
        opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
        before = lin(x).detach()
        (lin(x) * torch.randn(64, 4)).sum().backward()
        opt.step()
        return float((lin(x).detach() - before).abs().mean())

    assert output_shift(False) > 50 * output_shift(True)
