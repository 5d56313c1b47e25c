"""train.grow: a drafter grown by identity layers drafts exactly as before, then trains the new layers."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.config import DFlashConfigError
from dflash_sglang.core.drafter import DFlashDrafter
from dflash_sglang.train.grow import RESIDUAL_WRITES, grow_layers
from tests.core.test_drafter import full_ctx, inputs, make_cfg, randomized


def _hidden(model: DFlashDrafter) -> torch.Tensor:
    taps, embeds, ctx_pos, block_pos = inputs(bs=2)
    return model.forward_block(embeds, block_pos, full_ctx(model, taps, ctx_pos))


def test_grown_drafter_starts_with_the_same_hidden_states() -> None:
    old = randomized(make_cfg(layers=2))
    old.draft_vocab = torch.tensor([3, 5, 7])
    before = {k: v.clone() for k, v in old.state_dict().items()}
    grown = grow_layers(old, 2, seed=3)
    assert grown.cfg.num_hidden_layers == 4 and len(grown.layers) == 4
    assert torch.equal(grown.draft_vocab, old.draft_vocab)
    for k, v in old.state_dict().items():
        assert torch.equal(v, before[k]), f"grow_layers changed the source drafter's {k}"
        assert torch.equal(grown.state_dict()[k], v), k
    torch.testing.assert_close(_hidden(grown), _hidden(old), rtol=0, atol=1e-6)


def test_new_layers_are_random_apart_from_their_residual_writes() -> None:
    """Without the zeroed residual writes the grown drafter would draft differently; with them, both
    write projections are the only zero weights of the new layer, and they get gradients at once."""
    old = randomized(make_cfg(layers=1))
    grown = grow_layers(old, 1)
    new = grown.layers[1]
    for name, p in new.named_parameters():
        zero = name.removesuffix(".weight") in RESIDUAL_WRITES
        assert bool((p == 0).all()) == zero, name
    with torch.no_grad():
        for proj in RESIDUAL_WRITES:
            new.get_submodule(proj).weight.normal_(0, 0.2)
    assert not torch.allclose(_hidden(grown), _hidden(old), atol=1e-3)
    for proj in RESIDUAL_WRITES:
        new.get_submodule(proj).weight.data.zero_()
    grown.train()
    _hidden(grown).square().sum().backward()
    for proj in RESIDUAL_WRITES:
        g = new.get_submodule(proj).weight.grad
        assert g is not None and g.abs().sum() > 0, proj


def test_grown_drafter_round_trips_through_a_checkpoint(tmp_path) -> None:  # noqa: ANN001
    grown = grow_layers(randomized(make_cfg(layers=1, layer_types=["sliding_attention"],
                                            sliding_window=4)), 1)
    assert grown.cfg.layer_types == ("sliding_attention", "full_attention")
    grown.save_pretrained(tmp_path / "d")
    back = DFlashDrafter.from_pretrained(tmp_path / "d")
    assert back.cfg.num_hidden_layers == 2 and back.cfg.layer_types == grown.cfg.layer_types
    for (k, x), (_, y) in zip(grown.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(x, y), k


def test_grow_needs_at_least_one_layer() -> None:
    with pytest.raises(DFlashConfigError, match="grow by at least one layer"):
        grow_layers(randomized(make_cfg(layers=1)), 0)
