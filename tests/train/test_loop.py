"""The training loop on a tiny random Llama target: learning, determinism, resume, checkpoint format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash_sglang.core.drafter import ContextKV, DFlashDrafter
from dflash_sglang.train.loop import STATE_FILE, TrainConfig, lr_factor

from .tiny import tiny_train


def _losses(res) -> list[float]:
    return [r["loss"] for r in res.history]


def test_loss_decreases_on_tiny_overfit_run(tmp_path: Path) -> None:
    res = tiny_train(tmp_path / "a", steps=40, lr=1e-2)
    losses = _losses(res)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses
    assert res.taus and res.taus[-1]["tau"] >= 1.0  # held-out tau measured at the end


def test_same_seed_same_loss_curve(tmp_path: Path) -> None:
    a, b = tiny_train(tmp_path / "a", steps=6), tiny_train(tmp_path / "b", steps=6)
    assert _losses(a) == _losses(b)
    c = tiny_train(tmp_path / "c", steps=6, seed=1)
    assert _losses(c) != _losses(a)


def test_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    full = tiny_train(tmp_path / "full", steps=8)
    part = tiny_train(tmp_path / "part", steps=8, stop_at=3)
    assert part.step == 3 and (tmp_path / "part" / STATE_FILE).is_file()
    resumed = tiny_train(tmp_path / "part", steps=8)
    assert resumed.step == 8
    assert _losses(resumed) == _losses(full)
    a = DFlashDrafter.from_pretrained(tmp_path / "full").state_dict()
    b = DFlashDrafter.from_pretrained(tmp_path / "part").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_lr_schedule_warmup_then_cosine() -> None:
    cfg = TrainConfig(out="x", steps=100, warmup=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(100, cfg) == pytest.approx(0.1)
    assert lr_factor(55, cfg) == pytest.approx(0.55)


def test_checkpoint_is_published_format(tmp_path: Path) -> None:
    tiny_train(tmp_path / "ck", steps=2, save_dtype="bfloat16")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert set(cfg["dflash_config"]) >= {"target_layer_ids", "mask_token_id", "block_size"}
    assert cfg["torch_dtype"] == "bfloat16"
    from safetensors.torch import load_file

    state = load_file(str(tmp_path / "ck" / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in state.values())
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in state)  # borrowed from the target
    DFlashDrafter.from_pretrained(tmp_path / "ck")


def test_checkpoint_matches_reference_model_class(tmp_path: Path) -> None:
    """Read-only oracle: the PyPI ``dflash`` model class loads our weights and computes the same states."""
    try:
        import dflash.model as oracle
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Config
    except Exception as exc:
        pytest.skip(f"reference oracle unavailable ({exc!r}); pip install --no-deps dflash==0.1.0")
    tiny_train(tmp_path / "ck", steps=3)
    ours = DFlashDrafter.from_pretrained(tmp_path / "ck")
    d = json.loads((tmp_path / "ck" / "config.json").read_text())
    kw = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "rope_theta", "torch_dtype")}
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": d["rope_theta"]}
    ocfg = Qwen3Config(**kw)
    ocfg._attn_implementation = "sdpa"
    ref = oracle.DFlashDraftModel(ocfg).eval()
    from safetensors.torch import load_file

    ref.load_state_dict(load_file(str(tmp_path / "ck" / "model.safetensors")), strict=True)
    g = torch.Generator().manual_seed(0)
    ctx, nb, h = 7, ours.cfg.block_size, ours.cfg.hidden_size
    taps = torch.randn(1, ctx, ours.cfg.num_taps * h, generator=g)
    embeds = torch.randn(1, nb, h, generator=g)
    with torch.no_grad():
        cpos = torch.arange(ctx)[None]
        k, v = ours.context_kv(taps, cpos)
        got = ours.forward_block(embeds, torch.arange(ctx, ctx + nb)[None],
                                 ContextKV(k, v, cpos, torch.ones(1, ctx, dtype=torch.bool)))
        want = ref(position_ids=torch.arange(ctx + nb)[None], noise_embedding=embeds, target_hidden=taps)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_copy_top_layers_starts_the_drafter_as_the_targets_top_stack() -> None:
    """--init-layers target-top: draft layers are the target's top layers, and the fused context of a
    position is exactly what the first copied layer's attention reads there (its input norm applied to
    the hidden state below it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
    from dflash_sglang.train.loop import copy_top_layers

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                         initializer_range=0.3)).eval()
    drafter = random_drafter(drafter_config_for(model.config, 2, 4, 0, 3), 0)
    assert drafter.cfg.target_layer_ids == (1, 3, 5)
    assert copy_top_layers(drafter, model) == [6, 7]
    for draft, src in zip(drafter.layers, model.model.layers[6:], strict=True):
        assert torch.equal(draft.self_attn.k_proj.weight, src.self_attn.k_proj.weight)
        assert torch.equal(draft.mlp.down_proj.weight, src.mlp.down_proj.weight)
        assert torch.equal(draft.post_attention_layernorm.weight, src.post_attention_layernorm.weight)
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i + 1] for i in drafter.cfg.target_layer_ids], dim=-1)
        want = model.model.layers[6].input_layernorm(hs[6])  # layer 5's output, as layer 6 reads it
        torch.testing.assert_close(drafter.fuse_context(taps), want)


def test_bf16_compute_changes_the_step_by_rounding_only(tmp_path: Path) -> None:
    """compute_dtype bfloat16 really runs the step in bf16 (the losses differ from float32's) and
    stays within bf16 rounding of the float32 run over a few steps."""
    f32 = _losses(tiny_train(tmp_path / "f", steps=4, compute_dtype="float32"))
    b16 = _losses(tiny_train(tmp_path / "b", steps=4, compute_dtype="bfloat16"))
    assert f32 != b16
    for x, y in zip(f32, b16, strict=True):
        assert abs(x - y) < 0.03 * abs(x), (f32, b16)


@pytest.mark.parametrize(("native", "want"), [(True, torch.bfloat16), (False, None)])
def test_auto_compute_dtype_follows_native_bf16(monkeypatch: pytest.MonkeyPatch, native: bool,
                                               want: torch.dtype | None) -> None:
    import dflash_sglang.train.loop as loop

    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda: native)
    with loop.step_autocast(TrainConfig(out="x"), "cpu"):
        got = (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    assert got == (want or torch.float32)
    with loop.step_autocast(TrainConfig(out="x", compute_dtype="float32"), "cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_soft_label_training_learns_the_greedy_tokens(tmp_path: Path) -> None:
    res = tiny_train(tmp_path / "s", steps=40, lr=1e-2, soft_labels=1.0)
    accs = [r["acc_len"] for r in res.history]
    assert sum(accs[-5:]) / 5 > sum(accs[:5]) / 5, accs


def test_predraft_share_mixes_block_forms_by_step_and_leaves_old_runs_alone() -> None:
    from dflash_sglang.train.loop import step_known

    assert all(step_known(TrainConfig(out="x"), s) == 0 for s in range(50))
    cfg = TrainConfig(out="x", predraft_share=0.5, predraft_known=2)
    known = [step_known(cfg, s) for s in range(400)]
    assert known == [step_known(cfg, s) for s in range(400)]  # a function of (seed, step): resumable
    share = sum(k > 0 for k in known) / len(known)
    assert 0.4 < share < 0.6 and set(known) == {0, 1, 2}, (share, set(known))


def test_predraft_blocks_train(tmp_path: Path) -> None:
    """Every step made of pre-draft blocks: the drafter still learns (acc_len over the drafted
    positions rises), and the run writes the same checkpoint format."""
    res = tiny_train(tmp_path / "p", steps=40, lr=1e-2, predraft_share=1.0, predraft_known=2)
    accs = [r["acc_len"] for r in res.history]
    assert sum(accs[-5:]) / 5 > sum(accs[:5]) / 5, accs
    assert DFlashDrafter.from_pretrained(tmp_path / "p").cfg.block_size == 4
