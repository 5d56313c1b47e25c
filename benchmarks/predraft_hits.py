"""Pre-draft outcome prediction (issue #20): how often the F most likely (accept length, bonus) guesses,
made from the drafter alone, contain verify's real outcome.

Runs the reference engine (greedy, batch 1) over Spec-Bench first turns, records every step's drafter
distribution and verify outcome (``core.engine.StepRecord``), then scores ``core.predraft``: with the
raw drafter confidence (identity calibration) and with a calibration fitted on the other half of the
prompts (cross-fitted by prompt parity, so no step is scored by a calibration that saw it).

    python benchmarks/predraft_hits.py --draft drafters/smollm2-135m-dflash-b16 --per-category 4 \\
        --max-new-tokens 64 --block-size 16 --out benchmarks/results/predraft/hits.json
"""

from __future__ import annotations

import argparse
import time

import torch

FANOUTS = (1, 2, 4, 8)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafters/smollm2-135m-dflash-b16")
    p.add_argument("--prompts", default="../shared/data/spec_bench_questions.jsonl")
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--alternatives", type=int, default=4, help="bonus candidates per block position")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    from dflash_sglang.bench.machine import finish_result
    from dflash_sglang.core.engine import EngineConfig, ReferenceEngine, StepRecord
    from dflash_sglang.core.predraft import Calibration, DraftBelief, hits, predict_outcomes
    from dflash_sglang.core.sampling import SamplingConfig
    from dflash_sglang.generate_cli import load_pair
    from dflash_sglang.models import fetch_model
    from dflash_sglang.prompts import chat_ids, eos_token_ids, first_per_category, load_prompts

    drafter, model, tok, target = load_pair(a.draft, str(fetch_model("smollm2-135m")))
    prompts = first_per_category(load_prompts(a.prompts), a.per_category)
    steps: list[tuple[int, DraftBelief, torch.Tensor, torch.Tensor]] = []  # (prompt, belief, k, bonus)
    current = [0]

    def observe(rec: StepRecord) -> None:
        assert rec.draft_logits is not None
        probs = torch.softmax(rec.draft_logits.float(), -1)
        belief = DraftBelief.from_probs(probs, rec.block[:, 1:], a.alternatives)
        steps.append((current[0], belief, rec.result.accept_len, rec.result.bonus))

    engine = ReferenceEngine(target, drafter, EngineConfig(a.block_size, a.max_new_tokens,
                                                           eos_token_ids(model, tok)), observer=observe)
    t0 = time.perf_counter()
    for i, pr in enumerate(prompts):
        current[0] = i
        engine.generate([chat_ids(tok, pr.text)], SamplingConfig.uniform(1, 0.0))
    gen_s = time.perf_counter() - t0

    def pairs(part: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(confidence, accepted) of every verified draft: positions 1 .. min(k + 1, B - 1)."""
        conf, acc = [], []
        for _, b, k, _ in part:
            pos = torch.arange(b.confidence.shape[1])[None]
            seen = pos <= k[:, None]
            conf.append(b.confidence[seen])
            acc.append((pos < k[:, None])[seen])
        return torch.cat(conf), torch.cat(acc)

    halves = [[s for s in steps if s[0] % 2 == h] for h in (0, 1)]
    calibrations = {"identity": [Calibration.identity(), Calibration.identity()],
                    "fitted": [Calibration.fit(*pairs(halves[1])), Calibration.fit(*pairs(halves[0]))]}
    res: dict = {"steps": len(steps), "prompts": len(prompts), "block_size": a.block_size,
                 "all_accepted_share": sum(int((k == a.block_size - 1).sum()) for *_, k, _ in steps)
                 / max(1, len(steps)),
                 "accept_len_hist": torch.bincount(torch.cat([k for *_, k, _ in steps]),
                                                   minlength=a.block_size).tolist()}
    for name, cals in calibrations.items():
        hit = torch.zeros(max(FANOUTS))
        predicted = torch.zeros(max(FANOUTS))
        for h in (0, 1):
            for _, belief, k, bonus in halves[h]:
                g = predict_outcomes(belief, cals[h], max(FANOUTS))
                hit += hits(g, k, bonus).float().sum(0)
                predicted += g.prob.cumsum(1).sum(0)
        res[name] = {f"F={f}": {"hit_rate": round(float(hit[f - 1]) / len(steps), 4),
                                "predicted": round(float(predicted[f - 1]) / len(steps), 4)}
                     for f in FANOUTS}
    conf, acc = pairs(steps)
    res["calibration_all"] = {"edges": [round(float(x), 4) for x in Calibration.fit(conf, acc).edges],
                              "rates": [round(float(x), 4) for x in Calibration.fit(conf, acc).rates]}
    res["generate_s"] = round(gen_s, 1)
    finish_result(res, a, a.out)


if __name__ == "__main__":
    main()
