"""Does serving accept what training measures? The reference engine decodes held-out distill prompts
greedily; for every block it verified, the training code's teacher-forced acceptance of the block
anchored at the same position (recipe.build_batch + BlockLoss.draft_hits, stored tap features) is
compared with the engine's accept length. Equal on every block means the training objective, the
held-out metric and the engine see the same drafter; a gap between held-out acc_len and Spec-Bench tau
is then the prompts, not the code.

    python benchmarks/train_engine_parity.py --draft drafters/smollm2-135m-dflash-b16 --rows 12 \\
        --out benchmarks/results/train-engine-parity/smollm2-135m-b16.json
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafters/smollm2-135m-dflash-b16")
    p.add_argument("--store", default="data/distill/smollm2-135m-heldout", help="distill store with taps")
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    from dflash_sglang.bench.machine import finish_result
    from dflash_sglang.core.engine import EngineConfig, ReferenceEngine
    from dflash_sglang.core.sampling import SamplingConfig
    from dflash_sglang.generate_cli import load_pair
    from dflash_sglang.models import fetch_model
    from dflash_sglang.prompts import eos_token_ids
    from dflash_sglang.train.distill_store import DistillStore
    from dflash_sglang.train.recipe import BlockLoss, build_batch

    drafter, model, tok, target = load_pair(a.draft, str(fetch_model("smollm2-135m")))
    nb, mask = drafter.cfg.block_size, int(drafter.cfg.mask_token_id)
    samples = DistillStore.open(a.store).training_samples(drafter.cfg.target_layer_ids)[: a.rows]
    engine = ReferenceEngine(target, drafter, EngineConfig(nb, a.max_new_tokens, eos_token_ids(model, tok)))
    loss = BlockLoss(drafter, target.embed_weight, target.lm_head_weight, 7.0)
    same_output, eng_k, tf_k = 0, [], []
    for s in samples:
        out = engine.generate([s.ids[: s.prompt_len].tolist()], SamplingConfig.uniform(1))[0]
        if out.output_ids != s.ids[s.prompt_len: s.prompt_len + len(out.output_ids)].tolist():
            continue  # not the stored answer (cannot happen for a greedy fp32 store of this target)
        same_output += 1
        starts = (s.prompt_len + torch.tensor([0, *out.committed_per_step]).cumsum(0))[:-1]  # block starts
        keep = starts + nb <= len(s.ids)
        anchors = starts[keep]
        b = build_batch([s.ids.long()], [anchors], [s.taps.float()], nb, len(anchors), mask)
        correct, _ = loss.draft_hits(b)
        tf_k += correct.long().cumprod(-1).sum(-1)[0].tolist()
        eng_k += (torch.tensor(out.committed_per_step)[keep] - 1).tolist()
    e, t = torch.tensor(eng_k).float(), torch.tensor(tf_k).float()
    res = {"rows": len(samples), "engine_output_equals_store": same_output, "blocks": len(eng_k),
           "engine_tau": round(float(1 + e.mean()), 4),
           "teacher_forced_tau_same_blocks": round(float(1 + t.mean()), 4),
           "blocks_agreeing": round(float((e == t).float().mean()), 4)}
    finish_result(res, a, a.out)


if __name__ == "__main__":
    main()
