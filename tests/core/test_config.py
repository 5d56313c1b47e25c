"""DFlashConfig parsing, defaults and one-line, field-naming errors for every invalid case."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dflash_sglang.core.config import (
    DFlashConfig,
    DFlashConfigError,
    TargetSpec,
    default_target_layer_ids,
)


def published(**overrides: Any) -> dict[str, Any]:
    """A config.json shaped like the published Qwen3-8B DFlash drafter (small numbers)."""
    d: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "vocab_size": 1000,
        "block_size": 16,
        "num_target_layers": 36,
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 999},
    }
    d.update(overrides)
    return d


def without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    d = copy.deepcopy(d)
    for k in keys:
        if "." in k:
            outer, inner = k.split(".", 1)
            d[outer].pop(inner, None)
        else:
            d.pop(k, None)
    return d


def with_dflash(**dd: Any) -> dict[str, Any]:
    d = published()
    d["dflash_config"] = {**d["dflash_config"], **dd}
    return d


def assert_one_line(err: pytest.ExceptionInfo[DFlashConfigError], field: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert msg.strip() == msg and msg, msg
    assert field in msg, f"{field!r} not named in: {msg}"


class FakeTokenizer:
    """Just enough of a HF tokenizer for ``with_tokenizer``."""

    unk_token_id = 0

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.vocab.get(token, self.unk_token_id)


# ----------------------------------------------------------------------------- parsing
def test_parses_published_config() -> None:
    cfg = DFlashConfig.from_dict(published())
    assert cfg.hidden_size == 64
    assert cfg.intermediate_size == 192
    assert cfg.num_hidden_layers == 5
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.rms_norm_eps == 1e-6
    assert cfg.rope_theta == 1000000.0
    assert cfg.max_position_embeddings == 40960
    assert cfg.vocab_size == 1000
    assert cfg.block_size == 16
    assert cfg.num_target_layers == 36
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33)
    assert cfg.num_taps == 5
    assert cfg.mask_token_id == 999
    assert cfg.mask_token is None
    assert cfg.layer_types == () and cfg.sliding_window is None
    assert [cfg.layer_type(i) for i in range(5)] == ["full_attention"] * 5
    assert cfg.input_embedding_scale == 1.0 and cfg.output_multiplier == 1.0
    assert cfg.final_logit_softcapping is None
    assert cfg.attention_bias is False


def test_optional_fields_default() -> None:
    d = without(
        published(),
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_theta",
        "architectures",
    )
    cfg = DFlashConfig.from_dict(d)
    assert cfg.num_key_value_heads == cfg.num_attention_heads == 4
    assert cfg.head_dim == 64 // 4
    assert cfg.rms_norm_eps == 1e-6
    assert cfg.rope_theta == 10000.0


def test_dflash_config_values_override_top_level() -> None:
    d = with_dflash(
        block_size=8, output_multiplier=0.5, final_logit_softcapping=30.0, input_embedding_scale=2.0
    )
    cfg = DFlashConfig.from_dict(d)
    assert cfg.block_size == 8
    assert cfg.output_multiplier == 0.5
    assert cfg.final_logit_softcapping == 30.0
    assert cfg.input_embedding_scale == 2.0


def test_nonpositive_softcap_means_none() -> None:
    assert DFlashConfig.from_dict(with_dflash(final_logit_softcapping=0.0)).final_logit_softcapping is None


def test_sliding_layers_parse() -> None:
    d = published(
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=128
    )
    cfg = DFlashConfig.from_dict(d)
    assert cfg.layer_types == ("sliding_attention", "full_attention")
    assert cfg.sliding_window == 128
    assert cfg.layer_type(0) == "sliding_attention" and cfg.layer_type(1) == "full_attention"


# ------------------------------------------------------------------------- tap defaults
def test_default_taps_one_tap_is_middle() -> None:
    assert default_target_layer_ids(36, 1) == (18,)
    assert default_target_layer_ids(7, 1) == (3,)


def test_default_taps_spread() -> None:
    # round(1 + i*(36-4)/4) for i in 0..4
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(28, 3) == (1, 13, 25)
    assert default_target_layer_ids(36, 2) == (1, 33)


def test_default_taps_bad_count() -> None:
    with pytest.raises(DFlashConfigError) as e:
        default_target_layer_ids(36, 0)
    assert_one_line(e, "tap")


@pytest.mark.parametrize("layers, expect", [(1, (18,)), (5, (1, 9, 17, 25, 33)), (3, (1, 17, 33))])
def test_taps_default_from_draft_layer_count(layers: int, expect: tuple[int, ...]) -> None:
    d = without(published(num_hidden_layers=layers), "dflash_config.target_layer_ids")
    assert DFlashConfig.from_dict(d).target_layer_ids == expect


# --------------------------------------------------------------------------------- rope
def test_rope_theta_from_rope_parameters() -> None:
    d = without(published(rope_parameters={"rope_type": "default", "rope_theta": 5e5}), "rope_theta")
    assert DFlashConfig.from_dict(d).rope_theta == 5e5


def test_rope_scaling_null_is_default() -> None:
    assert DFlashConfig.from_dict(published(rope_scaling=None)).rope_theta == 1000000.0


# --------------------------------------------------------------------------- mask token
def test_mask_token_string_resolved_by_tokenizer() -> None:
    d = without(published(), "dflash_config.mask_token_id")
    d["dflash_config"]["mask_token"] = "<|MASK|>"
    cfg = DFlashConfig.from_dict(d)
    assert cfg.mask_token_id is None and cfg.mask_token == "<|MASK|>"
    with pytest.raises(DFlashConfigError) as e:
        cfg.validate_against(TargetSpec(64, 1000, 36))
    assert_one_line(e, "mask_token")
    resolved = cfg.with_tokenizer(FakeTokenizer({"<|MASK|>": 151}))
    assert resolved.mask_token_id == 151
    assert resolved.mask_token == "<|MASK|>"
    assert resolved.target_layer_ids == cfg.target_layer_ids
    resolved.validate_against(TargetSpec(64, 1000, 36))


def test_with_tokenizer_keeps_explicit_id() -> None:
    cfg = DFlashConfig.from_dict(published())
    assert cfg.with_tokenizer(FakeTokenizer({})) is cfg


def test_mask_token_unknown_to_tokenizer() -> None:
    d = without(published(), "dflash_config.mask_token_id")
    d["dflash_config"]["mask_token"] = "<|nope|>"
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig.from_dict(d).with_tokenizer(FakeTokenizer({"<|MASK|>": 5}))
    assert_one_line(e, "mask_token")


# ------------------------------------------------------------------------- round trip
def test_to_dict_round_trips() -> None:
    cfg = DFlashConfig.from_dict(with_dflash(output_multiplier=0.5, final_logit_softcapping=30.0))
    again = DFlashConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


def test_from_pretrained_dir_and_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(published()))
    assert DFlashConfig.from_pretrained(tmp_path) == DFlashConfig.from_dict(published())
    assert DFlashConfig.from_pretrained(tmp_path / "config.json").target_layer_ids == (1, 9, 17, 25, 33)


def test_validate_against_matching_target() -> None:
    DFlashConfig.from_dict(published()).validate_against(TargetSpec(64, 1000, 36))


def test_target_spec_from_hf_config() -> None:
    class Text:
        hidden_size, vocab_size, num_hidden_layers = 64, 1000, 36

    class Multimodal:
        text_config = Text()

    assert TargetSpec.from_hf_config(Text()) == TargetSpec(64, 1000, 36)
    assert TargetSpec.from_hf_config(Multimodal()) == TargetSpec(64, 1000, 36)


# ------------------------------------------------------------------------------ errors
BAD_DICTS: list[tuple[str, dict[str, Any], str]] = [
    ("architecture", published(architectures=["Qwen3ForCausalLM"]), "architectures"),
    ("no hidden_size", without(published(), "hidden_size"), "hidden_size"),
    ("null hidden_size", published(hidden_size=None), "hidden_size"),
    ("no vocab_size", without(published(), "vocab_size"), "vocab_size"),
    ("no intermediate_size", without(published(), "intermediate_size"), "intermediate_size"),
    ("no num_hidden_layers", without(published(), "num_hidden_layers"), "num_hidden_layers"),
    ("no num_attention_heads", without(published(), "num_attention_heads"), "num_attention_heads"),
    ("no num_target_layers", without(published(), "num_target_layers"), "num_target_layers"),
    ("zero hidden_size", published(hidden_size=0), "hidden_size"),
    ("negative vocab", published(vocab_size=-3), "vocab_size"),
    ("kv heads do not divide", published(num_key_value_heads=3), "num_key_value_heads"),
    ("block_size 0", with_dflash(block_size=0), "block_size"),
    (
        "block_size negative top-level",
        without(published(block_size=-1), "dflash_config.block_size"),
        "block_size",
    ),
    ("no mask token", without(published(), "dflash_config.mask_token_id"), "mask_token"),
    ("mask id == vocab", with_dflash(mask_token_id=1000), "mask_token_id"),
    ("mask id negative", with_dflash(mask_token_id=-1), "mask_token_id"),
    ("tap id == num_target_layers", with_dflash(target_layer_ids=[1, 9, 36]), "target_layer_ids"),
    ("tap id negative", with_dflash(target_layer_ids=[-1, 9]), "target_layer_ids"),
    ("layer_types too short", published(layer_types=["full_attention"] * 4), "layer_types"),
    ("layer_types too long", published(layer_types=["full_attention"] * 6), "layer_types"),
    (
        "layer_types unknown",
        published(layer_types=["full_attention"] * 4 + ["linear_attention"]),
        "layer_types",
    ),
    (
        "sliding without window",
        published(layer_types=["sliding_attention"] + ["full_attention"] * 4),
        "sliding_window",
    ),
    (
        "sliding with zero window",
        published(layer_types=["sliding_attention"] + ["full_attention"] * 4, sliding_window=0),
        "sliding_window",
    ),
    ("rope yarn", published(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "rope"),
    ("rope_scaling linear", published(rope_scaling={"type": "linear", "factor": 2.0}), "rope"),
    ("rope llama3", published(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5}), "rope"),
    ("rope_parameters not an object", published(rope_parameters="default"), "rope_parameters"),
    ("rope_theta text", published(rope_theta="fast"), "rope_theta"),
    ("rope_theta zero", published(rope_theta=0), "rope_theta"),
    ("hidden_size text", published(hidden_size="big"), "hidden_size"),
    ("hidden_size fractional", published(hidden_size=64.5), "hidden_size"),
    ("hidden_size bool", published(hidden_size=True), "hidden_size"),
    ("zero heads", published(num_attention_heads=0, head_dim=None), "num_attention_heads"),
    (
        "zero draft layers, default taps",
        without(published(num_hidden_layers=0), "dflash_config.target_layer_ids"),
        "num_hidden_layers",
    ),
    ("rms_norm_eps text", published(rms_norm_eps="tiny"), "rms_norm_eps"),
    ("sliding_window text", published(sliding_window="wide"), "sliding_window"),
    ("block_size text", with_dflash(block_size="sixteen"), "block_size"),
    ("mask id text", with_dflash(mask_token_id="mask"), "mask_token_id"),
    ("taps not a list", with_dflash(target_layer_ids=5), "target_layer_ids"),
    ("tap id text", with_dflash(target_layer_ids=[1, "x"]), "target_layer_ids"),
    ("softcap text", with_dflash(final_logit_softcapping="high"), "final_logit_softcapping"),
    ("dflash_config not an object", published(dflash_config=[1, 9]), "dflash_config"),
    ("layer_types not a list", published(layer_types="full_attention"), "layer_types"),
    ("config is a list", [published()], "config.json"),
]


@pytest.mark.parametrize("d, field", [(d, f) for _, d, f in BAD_DICTS], ids=[n for n, _, _ in BAD_DICTS])
def test_invalid_config_raises_one_line(d: dict[str, Any], field: str) -> None:
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig.from_dict(copy.deepcopy(d))
    assert_one_line(e, field)


def test_null_optional_fields_use_defaults() -> None:
    d = published(
        rms_norm_eps=None,
        max_position_embeddings=None,
        sliding_window=None,
        block_size=None,
        rope_theta=None,
        num_key_value_heads=None,
        head_dim=None,
    )
    d["dflash_config"]["block_size"] = None
    cfg = DFlashConfig.from_dict(d)
    assert (cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.block_size) == (1e-6, 32768, 16)
    assert (cfg.rope_theta, cfg.num_key_value_heads, cfg.head_dim) == (10000.0, 4, 16)
    assert cfg.sliding_window is None


def test_integral_floats_and_numeric_strings_accepted() -> None:
    cfg = DFlashConfig.from_dict(published(hidden_size=64.0, vocab_size="1000"))
    assert (cfg.hidden_size, cfg.vocab_size) == (64, 1000)


def test_error_is_a_value_error() -> None:
    assert issubclass(DFlashConfigError, ValueError)


def test_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig.from_pretrained(tmp_path)
    assert_one_line(e, "config.json")


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig.from_pretrained(tmp_path / "nowhere")
    assert_one_line(e, "config.json")


@pytest.mark.parametrize(
    "text",
    ["{not json", "", '{"hidden_size": 64,\n\n  "vocab_size": }'],
    ids=["garbage", "empty", "truncated"],
)
def test_bad_json(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig.from_pretrained(tmp_path)
    assert_one_line(e, "config.json")
    assert "JSON" in str(e.value)


@pytest.mark.parametrize("text", ["[]", "42", '"DFlashDraftModel"', "null"])
def test_json_that_is_not_an_object(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(DFlashConfigError) as e:
        DFlashConfig.from_pretrained(tmp_path)
    assert_one_line(e, "config.json")


@pytest.mark.parametrize(
    "target, field",
    [
        (TargetSpec(hidden_size=128, vocab_size=1000, num_layers=36), "hidden_size"),
        (TargetSpec(hidden_size=64, vocab_size=1001, num_layers=36), "vocab_size"),
        (TargetSpec(hidden_size=64, vocab_size=1000, num_layers=33), "target_layer_ids"),
        (TargetSpec(hidden_size=64, vocab_size=1000, num_layers=24), "target_layer_ids"),
    ],
    ids=["hidden", "vocab", "tap-equals-depth", "tap-beyond-depth"],
)
def test_validate_against_mismatch(target: TargetSpec, field: str) -> None:
    cfg = DFlashConfig.from_dict(published())
    with pytest.raises(DFlashConfigError) as e:
        cfg.validate_against(target)
    assert_one_line(e, field)


def test_validate_against_deeper_target_is_fine() -> None:
    # The drafter only needs its tap layers to exist in the target.
    DFlashConfig.from_dict(published()).validate_against(TargetSpec(64, 1000, 34))
