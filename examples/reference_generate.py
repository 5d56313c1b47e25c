"""One DFlash generation, step by step, with the core API (no SGLang involved).

    python examples/reference_generate.py [--draft DIR] [--block-size 8]

Without --draft a random drafter is built: the output is still exactly the target's greedy output,
only the acceptance is poor. That is the point of speculative decoding: the drafter decides speed,
the target alone decides the tokens.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from dflash_sglang.core.drafter import DFlashDrafter
from dflash_sglang.core.engine import EngineConfig, ReferenceEngine, autoregressive_generate
from dflash_sglang.core.random_drafter import build_random_drafter
from dflash_sglang.core.sampling import SamplingConfig
from dflash_sglang.core.target import HFTarget, load_hf_target
from dflash_sglang.models import fetch_model
from dflash_sglang.prompts import chat_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default=None)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--prompt", default="Explain in a few sentences why the sky is blue.")
    args = ap.parse_args()

    # 1. The target (an HF model) and the drafter (DFlash checkpoint; borrows the target's embedding
    #    and LM head, reads hidden states of a few target layers).
    target_path = fetch_model("smollm2-135m")
    draft_path = args.draft or build_random_drafter(target_path, tempfile.mkdtemp(), block_size=16)
    drafter = DFlashDrafter.from_pretrained(draft_path)
    model, tokenizer = load_hf_target(str(target_path))
    target = HFTarget(model, drafter.cfg.target_layer_ids)  # hooks the tap layers
    print(f"drafter: {drafter.cfg.num_hidden_layers} layers, taps {drafter.cfg.target_layer_ids}")

    # 2. Speculative generation: each step drafts a block in ONE drafter pass, verifies it in ONE
    #    target pass, and commits the accepted prefix plus a bonus token.
    prompt = chat_ids(tokenizer, args.prompt)
    engine = ReferenceEngine(target, drafter, EngineConfig(args.block_size, 64, eos_token_ids=(2,)))
    (result,) = engine.generate([prompt], SamplingConfig.uniform(1))
    print(tokenizer.decode(result.output_ids))
    print(f"tokens committed per step: {result.committed_per_step}")
    print(f"tau = {sum(result.committed_per_step) / result.steps:.2f}")

    # 3. Lossless: the same tokens as the target decoding alone.
    (plain,) = autoregressive_generate(target, [prompt], 64, (2,), SamplingConfig.uniform(1))
    print("identical to plain greedy decoding:", plain == result.output_ids)

    # 4. Sampling keeps the target's distribution (exact rejection sampling with draft probs).
    sampled = engine.generate([prompt], SamplingConfig.uniform(1, temperature=0.7),
                              torch.Generator().manual_seed(0))
    print("sampled:", tokenizer.decode(sampled[0].output_ids)[:200])


if __name__ == "__main__":
    main()
