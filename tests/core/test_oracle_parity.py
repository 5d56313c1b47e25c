"""Numerical parity of our drafter with the reference DFlash model (PyPI ``dflash``, test-only oracle).

The oracle is used read-only, as a black box: the same random weights are loaded into both models and
their outputs compared in fp32. Install it with ``pip install --no-deps dflash==0.1.0``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

try:
    import dflash.model as oracle
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Config
except Exception as exc:  # any import failure means "no oracle here"
    pytest.skip(
        f"reference oracle unavailable (`import dflash.model` failed: {exc!r}); "
        "install it with `pip install --no-deps dflash==0.1.0`",
        allow_module_level=True,
    )

from dflash_sglang.core.config import DFlashConfig
from dflash_sglang.core.drafter import ContextKV, DFlashDrafter

H, TAPS, BLOCK, VOCAB = 64, [1, 3, 5], 8, 100
ATOL = RTOL = 1e-5


def config_dict(**extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "vocab_size": VOCAB,
        "block_size": BLOCK,
        "num_target_layers": 8,
        "attention_bias": False,
        "dflash_config": {"target_layer_ids": TAPS, "mask_token_id": VOCAB - 1},
    }
    dd = extra.pop("dflash", {})
    d.update(extra)
    d["dflash_config"] = {**d["dflash_config"], **dd}
    return d


def oracle_config(d: dict[str, Any]) -> Qwen3Config:
    """The oracle's Qwen3Config for the same checkpoint config."""
    kw = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "rope_theta")}
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": d["rope_theta"]}
    if d.get("sliding_window") is not None:
        kw["use_sliding_window"] = True
    cfg = Qwen3Config(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def random_state(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        k: 1.0 + 0.2 * torch.randn(v.shape, generator=g)
        if v.dim() == 1
        else 0.15 * torch.randn(v.shape, generator=g)
        for k, v in model.state_dict().items()
    }


def pair(d: dict[str, Any], seed: int = 0) -> tuple[DFlashDrafter, Any]:
    ours = DFlashDrafter(DFlashConfig.from_dict(d)).eval()
    ref = oracle.DFlashDraftModel(oracle_config(d)).eval()
    assert set(ours.state_dict()) == set(ref.state_dict()), "parameter names differ from the reference"
    state = random_state(ours, seed)
    ours.load_published_state(state)
    ref.load_state_dict(state, strict=True)
    return ours, ref


def data(bs: int, ctx: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(bs, ctx, len(TAPS) * H, generator=g), torch.randn(bs, BLOCK, H, generator=g)


@torch.no_grad()
def ours_forward(model: DFlashDrafter, taps: torch.Tensor, embeds: torch.Tensor, start: int) -> torch.Tensor:
    bs, ctx = taps.shape[:2]
    cpos = torch.arange(start, start + ctx).expand(bs, ctx)
    bpos = torch.arange(start + ctx, start + ctx + BLOCK).expand(bs, BLOCK)
    k, v = model.context_kv(taps, cpos)
    return model.forward_block(embeds, bpos, ContextKV(k, v, cpos, torch.ones(bs, ctx, dtype=torch.bool)))


@torch.no_grad()
def oracle_forward(
    ref: Any, taps: torch.Tensor, embeds: torch.Tensor, start: int, scale: float = 1.0
) -> torch.Tensor:
    bs, ctx = taps.shape[:2]
    pos = torch.arange(start, start + ctx + BLOCK).expand(bs, ctx + BLOCK)
    # The reference scales the embeddings before the call (see its generate loop).
    return ref(position_ids=pos, noise_embedding=embeds * scale, target_hidden=taps)


CASES = {
    "full": {},
    "sliding": {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 5},
    "all-sliding": {"layer_types": ["sliding_attention"] * 2, "sliding_window": 7},
    "causal-flag": {"is_causal": True},
    "non-causal-sliding": {
        "is_causal": False,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 6,
    },
    "null-causal-flag": {
        "is_causal": None,
        "layer_types": ["full_attention", "sliding_attention"],
        "sliding_window": 5,
    },
    "one-layer-mha": {"num_hidden_layers": 1, "num_key_value_heads": 4},
    "theta-1e6": {"rope_theta": 1e6, "num_hidden_layers": 3},
}


@pytest.mark.parametrize("extra", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("bs, ctx, start", [(1, 11, 0), (2, 5, 37)], ids=["bs1", "bs2-offset"])
def test_forward_parity(extra: dict[str, Any], bs: int, ctx: int, start: int) -> None:
    ours, ref = pair(config_dict(**extra))
    taps, embeds = data(bs, ctx)
    got, want = ours_forward(ours, taps, embeds, start), oracle_forward(ref, taps, embeds, start)
    assert got.shape == want.shape == (bs, BLOCK, H)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_sliding_window_is_exercised() -> None:
    """Guard against a vacuous 'sliding' case: the window must change the result."""
    full, _ = pair(config_dict())
    sliding, _ = pair(config_dict(**CASES["sliding"]))
    taps, embeds = data(1, 11)
    a, b = ours_forward(full, taps, embeds, 0), ours_forward(sliding, taps, embeds, 0)
    assert not torch.allclose(a, b, atol=1e-3)


def test_input_embedding_scale_parity() -> None:
    ours, ref = pair(config_dict(dflash={"input_embedding_scale": 3.0}))
    taps, embeds = data(1, 9)
    want = oracle_forward(ref, taps, embeds, 4, scale=3.0)
    torch.testing.assert_close(ours_forward(ours, taps, embeds, 4), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "dd",
    [
        {},
        {"output_multiplier": 0.25},
        {"final_logit_softcapping": 2.5},
        {"output_multiplier": 0.5, "final_logit_softcapping": 4.0},
    ],
    ids=["plain", "multiplier", "softcap", "both"],
)
def test_logits_parity(dd: dict[str, Any]) -> None:
    ours, ref = pair(config_dict(dflash=dd))
    taps, embeds = data(1, 6)
    head = nn.Linear(H, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, H, generator=torch.Generator().manual_seed(5)))
        hidden = ours_forward(ours, taps, embeds, 0)
        torch.testing.assert_close(hidden, oracle_forward(ref, taps, embeds, 0), rtol=RTOL, atol=ATOL)
        got = ours.logits(hidden[:, 1:], head.weight)
        want = ref.compute_logits(hidden[:, 1:], head)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    if "final_logit_softcapping" in dd:
        assert got.abs().max() <= dd["final_logit_softcapping"]


@pytest.mark.parametrize("extra", [CASES["full"], CASES["sliding"]], ids=["full", "sliding"])
def test_multi_step_cached_parity(extra: dict[str, Any]) -> None:
    """Several draft steps: the oracle keeps context K/V in its cache, we append ours incrementally."""
    d = config_dict(**extra)
    ours, ref = pair(d, seed=3)
    cache = oracle._make_cache(ref.config)
    g = torch.Generator().manual_seed(9)
    keys: list[list[torch.Tensor]] = [[] for _ in ours.layers]
    values: list[list[torch.Tensor]] = [[] for _ in ours.layers]
    start = 0
    with torch.no_grad():
        for new in (6, 3, 1, 5):  # context tokens committed before each step
            taps = torch.randn(1, new, len(TAPS) * H, generator=g)
            embeds = torch.randn(1, BLOCK, H, generator=g)
            pos = torch.arange(start, start + new + BLOCK)[None]
            want = ref(
                position_ids=pos,
                noise_embedding=embeds,
                target_hidden=taps,
                past_key_values=cache,
                use_cache=True,
            )
            oracle._crop_to(cache, start + new)

            cpos = pos[:, :new]
            k, v = ours.context_kv(taps, cpos)
            for i in range(len(ours.layers)):
                keys[i].append(k[i])
                values[i].append(v[i])
            all_pos = torch.arange(start + new)[None]
            ctx = ContextKV(
                [torch.cat(x, 1) for x in keys],
                [torch.cat(x, 1) for x in values],
                all_pos,
                torch.ones(all_pos.shape, dtype=torch.bool),
            )
            got = ours.forward_block(embeds, pos[:, new:], ctx)
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
            start += new


def test_default_tap_layers_match_reference() -> None:
    from dflash_sglang.core.config import default_target_layer_ids

    for layers in (8, 28, 36, 40, 64):
        for n in (1, 2, 3, 5, 6):
            assert list(default_target_layer_ids(layers, n)) == oracle.build_target_layer_ids(layers, n)
