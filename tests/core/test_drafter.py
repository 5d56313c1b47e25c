"""DFlashDrafter: checkpoint round trip and errors, published parameter names, attention visibility."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_sglang.core.config import DFlashConfig, DFlashConfigError
from dflash_sglang.core.drafter import ContextKV, DFlashDrafter

H, T, V, B = 32, 3, 50, 6


def make_cfg(layers: int = 2, **extra: Any) -> DFlashConfig:
    d: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": H,
        "intermediate_size": 48,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": V,
        "block_size": B,
        "num_target_layers": 8,
        "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": V - 1},
    }
    d.update(extra)
    return DFlashConfig.from_dict(d)


def randomized(cfg: DFlashConfig, seed: int = 0) -> DFlashDrafter:
    """Every parameter random (norm weights around 1) so that no weight can go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    model = DFlashDrafter(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if p.dim() == 1 else 0.2 * noise)
    return model


def inputs(bs: int = 1, ctx: int = 7, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(bs, ctx, T * H, generator=g)
    embeds = torch.randn(bs, B, H, generator=g)
    ctx_pos = torch.arange(ctx).expand(bs, ctx)
    block_pos = torch.arange(ctx, ctx + B).expand(bs, B)
    return taps, embeds, ctx_pos, block_pos


def full_ctx(model: DFlashDrafter, taps: torch.Tensor, pos: torch.Tensor) -> ContextKV:
    k, v = model.context_kv(taps, pos)
    return ContextKV(k, v, pos, torch.ones(pos.shape, dtype=torch.bool))


@torch.no_grad()
def run(
    model: DFlashDrafter,
    taps: torch.Tensor,
    embeds: torch.Tensor,
    ctx_pos: torch.Tensor,
    block_pos: torch.Tensor,
) -> torch.Tensor:
    return model.forward_block(embeds, block_pos, full_ctx(model, taps, ctx_pos))


def assert_one_line(err: pytest.ExceptionInfo[DFlashConfigError], *needles: str) -> None:
    msg = str(err.value)
    assert msg and "\n" not in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in: {msg}"


# ------------------------------------------------------------------------ parameter names
def test_parameter_names_are_published_ones() -> None:
    names = set(DFlashDrafter(make_cfg(layers=1)).state_dict())
    expect = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    expect |= {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}
    expect |= {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"}
    expect |= {f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    expect |= {"layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight"}
    assert names == expect


def test_parameter_shapes() -> None:
    sd = DFlashDrafter(make_cfg(layers=2)).state_dict()
    assert sd["fc.weight"].shape == (H, T * H)
    assert sd["layers.1.self_attn.q_proj.weight"].shape == (4 * 8, H)
    assert sd["layers.1.self_attn.k_proj.weight"].shape == (2 * 8, H)
    assert sd["layers.1.self_attn.o_proj.weight"].shape == (H, 4 * 8)
    assert sd["layers.1.self_attn.k_norm.weight"].shape == (8,)
    assert sd["layers.1.mlp.down_proj.weight"].shape == (H, 48)
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in sd)


def test_attention_bias_adds_biases() -> None:
    names = set(DFlashDrafter(make_cfg(layers=1, attention_bias=True)).state_dict())
    assert {f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"} <= names


# ----------------------------------------------------------------------------- round trip
def test_save_load_round_trip(tmp_path: Path) -> None:
    cfg = make_cfg(layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=4)
    cfg = DFlashConfig.from_dict(
        {
            **cfg.to_dict(),
            "dflash_config": {
                **cfg.to_dict()["dflash_config"],
                "output_multiplier": 0.5,
                "final_logit_softcapping": 20.0,
            },
        }
    )
    model = randomized(cfg)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(model.state_dict())
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert loaded.cfg == cfg
    assert not loaded.training
    for k, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], t), k
    args = inputs()
    assert torch.equal(run(model, *args), run(loaded, *args))
    lm_head = torch.randn(V, H)
    h = run(model, *args)
    assert torch.equal(model.logits(h, lm_head), loaded.logits(h, lm_head))


def test_save_bf16_records_dtype(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    model.save_pretrained(tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(tmp_path / "model.safetensors")).values())
    loaded = DFlashDrafter.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    for k, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], t.to(torch.bfloat16)), k


def test_loads_prefixed_names_and_ignores_embed_and_head(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    state = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    state["model.embed_tokens.weight"] = torch.zeros(V, H)
    state["lm_head.weight"] = torch.zeros(V, H)
    (tmp_path / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    half = len(state) // 2
    items = sorted(state.items())
    save_file(dict(items[:half]), str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(dict(items[half:]), str(tmp_path / "model-00002-of-00002.safetensors"))
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    args = inputs()
    assert torch.equal(run(model, *args), run(loaded, *args))


# ------------------------------------------------------------------------ broken checkpoints
def _write(tmp_path: Path, model: DFlashDrafter, state: dict[str, torch.Tensor]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))


def test_missing_weight(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    state = dict(model.state_dict())
    del state["layers.1.mlp.up_proj.weight"]
    _write(tmp_path, model, state)
    with pytest.raises(DFlashConfigError) as e:
        DFlashDrafter.from_pretrained(tmp_path)
    assert_one_line(e, "layers.1.mlp.up_proj.weight", "missing")


def test_unexpected_weight(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    state = dict(model.state_dict())
    state["layers.2.mlp.up_proj.weight"] = state["layers.1.mlp.up_proj.weight"].clone()
    _write(tmp_path, model, state)
    with pytest.raises(DFlashConfigError) as e:
        DFlashDrafter.from_pretrained(tmp_path)
    assert_one_line(e, "layers.2.mlp.up_proj.weight", "unexpected")


def test_wrong_shape(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    state = dict(model.state_dict())
    state["fc.weight"] = torch.zeros(H, 2 * H)  # as if trained with two taps
    _write(tmp_path, model, state)
    with pytest.raises(DFlashConfigError) as e:
        DFlashDrafter.from_pretrained(tmp_path)
    assert_one_line(e, "fc.weight", str((H, 2 * H)), str((H, 3 * H)))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_safetensors(tmp_path: Path, damage: str) -> None:
    model = randomized(make_cfg())
    _write(tmp_path, model, dict(model.state_dict()))
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(
        {"garbage": b"\x00not a safetensors file" * 8, "truncated": data[: len(data) // 2], "empty": b""}[
            damage
        ]
    )
    with pytest.raises(DFlashConfigError) as e:
        DFlashDrafter.from_pretrained(tmp_path)
    assert_one_line(e, "model.safetensors")


def test_no_safetensors(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    (tmp_path / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(DFlashConfigError) as e:
        DFlashDrafter.from_pretrained(tmp_path)
    assert_one_line(e, "safetensors")


def test_no_config_json(tmp_path: Path) -> None:
    model = randomized(make_cfg())
    model.save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(DFlashConfigError) as e:
        DFlashDrafter.from_pretrained(tmp_path)
    assert_one_line(e, "config.json")


def test_load_published_state_rejects_mismatch_in_memory() -> None:
    model = DFlashDrafter(make_cfg(layers=1))
    state = dict(randomized(make_cfg(layers=2)).state_dict())
    with pytest.raises(DFlashConfigError) as e:
        model.load_published_state(state)
    assert_one_line(e, "layers.1.")


# ------------------------------------------------------------------------- block attention
def test_block_attention_is_non_causal() -> None:
    model = randomized(make_cfg())
    taps, embeds, cp, bp = inputs()
    base = run(model, taps, embeds, cp, bp)
    later = embeds.clone()
    later[:, B - 1] += 1.0  # a later mask-position embedding
    out = run(model, taps, later, cp, bp)
    assert not torch.allclose(out[:, 0], base[:, 0], atol=1e-4), "position 0 must see position B-1"
    assert not torch.allclose(out[:, 1], base[:, 1], atol=1e-4)


def test_sliding_layers_are_causal() -> None:
    # With only sliding (causal) layers, a later block position cannot reach an earlier one.
    model = randomized(make_cfg(layers=2, layer_types=["sliding_attention"] * 2, sliding_window=64))
    taps, embeds, cp, bp = inputs()
    base = run(model, taps, embeds, cp, bp)
    later = embeds.clone()
    later[:, B - 1] += 1.0
    out = run(model, taps, later, cp, bp)
    torch.testing.assert_close(out[:, : B - 1], base[:, : B - 1], rtol=0, atol=0)
    assert not torch.allclose(out[:, B - 1], base[:, B - 1], atol=1e-4)


def test_output_depends_on_context() -> None:
    model = randomized(make_cfg())
    taps, embeds, cp, bp = inputs()
    base = run(model, taps, embeds, cp, bp)
    other = taps.clone()
    other[:, 0] += 1.0
    assert not torch.allclose(run(model, other, embeds, cp, bp), base, atol=1e-4)


@pytest.mark.parametrize("where", ["end", "start", "middle"])
def test_context_padding_is_ignored(where: str) -> None:
    model = randomized(make_cfg())
    taps, embeds, cp, bp = inputs(ctx=5)
    base = run(model, taps, embeds, cp, bp)
    real = model.context_kv(taps, cp)
    pad = 4
    g = torch.Generator().manual_seed(7)
    keys, values = [], []
    for k, v in zip(*real, strict=True):
        gk = 1e3 * torch.randn(1, pad, *k.shape[2:], generator=g)
        gv = 1e3 * torch.randn(1, pad, *v.shape[2:], generator=g)
        cut = {"end": 5, "start": 0, "middle": 2}[where]
        keys.append(torch.cat([k[:, :cut], gk, k[:, cut:]], dim=1))
        values.append(torch.cat([v[:, :cut], gv, v[:, cut:]], dim=1))
    cut = {"end": 5, "start": 0, "middle": 2}[where]
    garbage_pos = torch.tensor([[999, -3, 7, 2]])
    pos = torch.cat([cp[:, :cut], garbage_pos, cp[:, cut:]], dim=1)
    valid = torch.cat(
        [
            torch.ones(1, cut, dtype=torch.bool),
            torch.zeros(1, pad, dtype=torch.bool),
            torch.ones(1, 5 - cut, dtype=torch.bool),
        ],
        dim=1,
    )
    with torch.no_grad():
        out = model.forward_block(embeds, bp, ContextKV(keys, values, pos, valid))
    torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-5)


def test_batched_ragged_context_matches_single() -> None:
    """Two requests with different context lengths, padded into one batch, match separate runs."""
    model = randomized(
        make_cfg(layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=5)
    )
    lens = [7, 3]
    singles, parts = [], []
    for i, n in enumerate(lens):
        taps, embeds, cp, bp = inputs(ctx=n, seed=10 + i)
        singles.append(run(model, taps, embeds, cp, bp))
        parts.append((taps, embeds, cp, bp))
    C = max(lens)
    taps = torch.zeros(2, C, T * H)
    pos = torch.zeros(2, C, dtype=torch.long)
    valid = torch.zeros(2, C, dtype=torch.bool)
    for i, (t, _, cp, _) in enumerate(parts):
        taps[i, : lens[i]] = t[0]
        pos[i, : lens[i]] = cp[0]
        valid[i, : lens[i]] = True
    embeds = torch.cat([p[1] for p in parts])
    bpos = torch.cat([p[3] for p in parts])
    with torch.no_grad():
        k, v = model.context_kv(taps, pos)
        out = model.forward_block(embeds, bpos, ContextKV(k, v, pos, valid))
    for i in range(2):
        torch.testing.assert_close(out[i : i + 1], singles[i], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ context K/V
@torch.no_grad()
def test_context_kv_incremental_equals_one_call() -> None:
    model = randomized(make_cfg())
    taps, embeds, cp, bp = inputs(ctx=9)
    k_all, v_all = model.context_kv(taps, cp)
    assert len(k_all) == len(v_all) == 2
    assert k_all[0].shape == v_all[0].shape == (1, 9, 2, 8)
    chunks = [(0, 4), (4, 5), (5, 9)]
    ks: list[list[torch.Tensor]] = [[], []]
    vs: list[list[torch.Tensor]] = [[], []]
    for a, b in chunks:
        k, v = model.context_kv(taps[:, a:b], cp[:, a:b])
        for layer in range(2):
            ks[layer].append(k[layer])
            vs[layer].append(v[layer])
    for layer in range(2):
        torch.testing.assert_close(torch.cat(ks[layer], dim=1), k_all[layer], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(torch.cat(vs[layer], dim=1), v_all[layer], rtol=1e-6, atol=1e-6)
    # Unbatched input works too, and each token's K depends only on its own features and position.
    k1, v1 = model.context_kv(taps[0, 6], cp[0, 6])
    torch.testing.assert_close(k1[1], k_all[1][0, 6], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v1[1], v_all[1][0, 6], rtol=1e-6, atol=1e-6)
    # Keys are position-indexed (RoPE); values are not.
    k_moved, v_moved = model.context_kv(taps[:, 6:7], cp[:, 6:7] + 3)
    assert not torch.allclose(k_moved[0], k_all[0][:, 6:7], atol=1e-4)
    torch.testing.assert_close(v_moved[0], v_all[0][:, 6:7], rtol=1e-6, atol=1e-6)
    # And forward_block over the incrementally built context equals the one-call result.
    ctx = ContextKV(
        [torch.cat(x, 1) for x in ks],
        [torch.cat(x, 1) for x in vs],
        cp,
        torch.ones(cp.shape, dtype=torch.bool),
    )
    torch.testing.assert_close(
        model.forward_block(embeds, bp, ctx), run(model, taps, embeds, cp, bp), rtol=1e-5, atol=1e-5
    )


def test_context_rope_uses_absolute_positions() -> None:
    """Shifting every position (context and block) by the same offset leaves the output unchanged."""
    model = randomized(make_cfg())
    taps, embeds, cp, bp = inputs()
    torch.testing.assert_close(
        run(model, taps, embeds, cp + 100, bp + 100), run(model, taps, embeds, cp, bp), rtol=1e-4, atol=1e-4
    )


# ---------------------------------------------------------------------------------- logits
def test_logits_multiplier_and_softcap() -> None:
    base = make_cfg()
    d = base.to_dict()
    d["dflash_config"].update(output_multiplier=0.5, final_logit_softcapping=3.0)
    model = randomized(DFlashConfig.from_dict(d))
    plain = randomized(base)
    h = torch.randn(2, 4, H)
    w = torch.randn(V, H)
    raw = plain.logits(h, w)
    torch.testing.assert_close(raw, h @ w.T)
    capped = model.logits(h, w)
    torch.testing.assert_close(capped, 3.0 * torch.tanh(0.5 * raw / 3.0))
    assert capped.abs().max() < 3.0


def test_input_embedding_scale_applies_to_block() -> None:
    d = make_cfg().to_dict()
    d["dflash_config"]["input_embedding_scale"] = 2.0
    scaled = randomized(DFlashConfig.from_dict(d))
    plain = randomized(make_cfg())
    taps, embeds, cp, bp = inputs()
    torch.testing.assert_close(run(scaled, taps, embeds, cp, bp), run(plain, taps, 2.0 * embeds, cp, bp))
