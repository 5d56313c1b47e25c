"""A tiny random Llama target, self-distilled samples and a drafter for it (shared by the train tests)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from dflash_sglang.core.drafter import DFlashDrafter
from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
from dflash_sglang.core.target import HFTarget
from dflash_sglang.train.data import GenSettings, Sample, answer_batch
from dflash_sglang.train.loop import TrainConfig, TrainResult, init_from_target, train
from dflash_sglang.train.prompt_labels import prompt_greedy

VOCAB, BLOCK, MASK, EOS = 64, 4, 0, 1


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=EOS, initializer_range=0.3)
    return LlamaForCausalLM(cfg).eval()


def tiny_drafter(model: torch.nn.Module, seed: int = 0) -> DFlashDrafter:
    cfg = drafter_config_for(model.config, num_layers=1, block_size=BLOCK, mask_token_id=MASK, num_taps=2)
    return init_from_target(random_drafter(cfg, seed), model)


def tiny_target(model: torch.nn.Module) -> HFTarget:
    return HFTarget(model, tiny_drafter(model).cfg.target_layer_ids)


def tiny_prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def tiny_samples(target: HFTarget, n: int = 8, answer: int = 20) -> list[Sample]:
    s = GenSettings(answer, 8, (), target.tap_layer_ids, True)
    return answer_batch(target, tiny_prompts(n), s)


def tiny_train(out: Path, steps: int, seed: int = 0, n_samples: int = 8, prompt_labels: bool = False,
               **kw: object) -> TrainResult:
    """``prompt_labels``: the samples carry the target's greedy tokens after every prompt prefix."""
    torch.set_num_threads(1)
    model = tiny_model()
    target = tiny_target(model)
    opts: dict = dict(batch_size=4, blocks_per_seq=4, lr=3e-3, warmup=2, save_every=1000, show_progress=False,
                      save_dtype="float32")
    cfg = TrainConfig(out=str(out), steps=steps, seed=seed, **{**opts, **kw})
    samples = tiny_samples(target, n_samples)
    if prompt_labels:
        greedy = prompt_greedy(target, [s.ids[: s.prompt_len].numpy() for s in samples])
        samples = [replace(s, greedy=torch.from_numpy(g)) for s, g in zip(samples, greedy, strict=True)]
    return train(cfg, tiny_drafter(model, seed), target, samples, tiny_prompts(2, 9), (EOS,))
