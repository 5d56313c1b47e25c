"""train.teacher: the target's logits recomputed from the last tap equal its own logits."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.train.teacher import TopLayersTeacher

from .tiny import tiny_model, tiny_target


def _target_logits_and_taps(bf16_taps: bool) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module, tuple]:
    model = tiny_model()
    target = tiny_target(model)
    ids = torch.randint(2, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(12).expand(2, 12)
    from transformers import DynamicCache

    out = target.forward(ids, pos, torch.ones(2, 12, dtype=torch.long), DynamicCache())
    taps = out.taps.bfloat16().float() if bf16_taps else out.taps
    return out.logits, taps, model, target.tap_layer_ids


def test_recomputed_logits_equal_the_targets_own() -> None:
    want, taps, model, layer_ids = _target_logits_and_taps(bf16_taps=False)
    teacher = TopLayersTeacher(model, layer_ids)
    assert len(teacher.layers) == model.config.num_hidden_layers - 1 - max(layer_ids)
    got = teacher(taps) @ model.get_output_embeddings().weight.T
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_taps_keep_the_logits_within_rounding() -> None:
    want, taps, model, layer_ids = _target_logits_and_taps(bf16_taps=True)
    got = TopLayersTeacher(model, layer_ids)(taps) @ model.get_output_embeddings().weight.T
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert not torch.equal(got, want)


def test_rejects_a_target_without_llama_layers() -> None:
    with pytest.raises(ValueError, match="Llama-shaped"):
        TopLayersTeacher(torch.nn.Linear(2, 2), (0,))
