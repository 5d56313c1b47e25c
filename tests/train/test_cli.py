"""``dflash-sglang train`` end to end on a tiny Llama that shares SmolLM2's tokenizer (chat template)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dflash_sglang.cli import build_parser, main
from dflash_sglang.core.drafter import DFlashDrafter


def test_parser_has_train() -> None:
    a = build_parser().parse_args(["train", "--target", "t", "--data", "a.jsonl", "b.jsonl", "--out", "o"])
    assert a.data == ["a.jsonl", "b.jsonl"] and a.features == "cache"
    assert a.block_size is None and a.layers is None and a.init_from is None  # defaults resolved in run_train


@pytest.fixture(scope="module")
def tiny_chat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from dflash_sglang.models import fetch_model

    src = fetch_model("smollm2-135m", log=lambda m: None)
    out = tmp_path_factory.mktemp("tiny_chat")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      eos_token_id=2, bos_token_id=1)
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).is_file():
            shutil.copy(src / f, out / f)
    return out


def _train_args(target: Path, tmp_path: Path, out: Path, *extra: str) -> list[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"What is {i} plus {i}?"}) + "\n" for i in range(7)))
    return ["train", "--target", str(target), "--data", str(prompts), "--out", str(out),
            "--num-prompts", "5", "--eval-prompts", "1", "--max-answer-tokens", "8", "--gen-batch-size", "4",
            "--batch-size", "2", "--blocks-per-seq", "2", "--eval-max-new-tokens", "6",
            "--cache-dir", str(tmp_path / "cache"), "--threads", "1", *extra]


@pytest.mark.parametrize("features", ["cache", "online"])
def test_train_command_end_to_end(tiny_chat_target: Path, tmp_path: Path, features: str) -> None:
    out = tmp_path / "drafter"
    args = _train_args(tiny_chat_target, tmp_path, out, "--block-size", "4", "--taps", "2", "--steps", "3",
                       "--features", features, "--state-dir", str(tmp_path / "state"))
    assert main(args) == 0
    d = DFlashDrafter.from_pretrained(out)
    assert d.cfg.block_size == 4 and len(d.cfg.target_layer_ids) == 2 and d.cfg.mask_token_id == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    log = [json.loads(x) for x in (tmp_path / "state" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert json.loads((tmp_path / "state" / "eval_tau.json").read_text())[-1]["step"] == 3


def test_init_from_warm_starts_with_the_checkpoint_weights(tiny_chat_target: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert main(_train_args(tiny_chat_target, tmp_path, first, "--block-size", "4", "--layers", "2",
                            "--steps", "2", "--state-dir", str(tmp_path / "s1"))) == 0
    # lr 0: one step must leave exactly the loaded weights; a fresh random init (seed 1) would not.
    second = tmp_path / "second"
    assert main(_train_args(tiny_chat_target, tmp_path, second, "--init-from", str(first), "--seed", "1",
                            "--lr", "0", "--steps", "1", "--state-dir", str(tmp_path / "s2"))) == 0
    a, b = DFlashDrafter.from_pretrained(first), DFlashDrafter.from_pretrained(second)
    assert b.cfg == a.cfg and b.cfg.block_size == 4 and b.cfg.num_hidden_layers == 2
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_init_from_rejects_disagreeing_drafter_flags(tiny_chat_target: Path, tmp_path: Path) -> None:
    from dflash_sglang.core.config import DFlashConfigError

    first = tmp_path / "first"
    assert main(_train_args(tiny_chat_target, tmp_path, first, "--block-size", "4", "--steps", "1",
                            "--state-dir", str(tmp_path / "s1"))) == 0
    with pytest.raises(DFlashConfigError, match="--block-size 8 disagrees with --init-from"):
        main(_train_args(tiny_chat_target, tmp_path, tmp_path / "x", "--init-from", str(first),
                         "--block-size", "8", "--steps", "1"))
    with pytest.raises(DFlashConfigError, match="--init-layers target-top starts a new drafter"):
        main(_train_args(tiny_chat_target, tmp_path, tmp_path / "y", "--init-from", str(first),
                         "--init-layers", "target-top", "--steps", "1"))


def test_grow_layers_warm_starts_a_deeper_drafter(tiny_chat_target: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert main(_train_args(tiny_chat_target, tmp_path, first, "--block-size", "4", "--layers", "1",
                            "--steps", "1", "--state-dir", str(tmp_path / "s1"))) == 0
    grown = tmp_path / "grown"
    assert main(_train_args(tiny_chat_target, tmp_path, grown, "--init-from", str(first),
                            "--grow-layers", "1", "--lr", "0", "--steps", "1",
                            "--state-dir", str(tmp_path / "s2"))) == 0
    a, b = DFlashDrafter.from_pretrained(first), DFlashDrafter.from_pretrained(grown)
    assert b.cfg.num_hidden_layers == 2 and b.cfg.block_size == 4
    for name, x in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], x), name
    assert not b.layers[1].self_attn.o_proj.weight.any() and b.layers[1].self_attn.q_proj.weight.any()
    with pytest.raises(SystemExit, match="--grow-layers grows a trained drafter"):
        main(_train_args(tiny_chat_target, tmp_path, tmp_path / "x", "--grow-layers", "1", "--steps", "1"))
