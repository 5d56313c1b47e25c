"""Pre-drafting in the reference engine (issue #20): hit rate by F, tau of pre-drafted against normal
blocks, CPU wall-clock with and without, and the GPU speedup those numbers imply.

Runs the same prompts (Spec-Bench first turns, greedy, batch 1) through ``ReferenceEngine`` with
pre-drafting off, on (F guesses, sequential) and on with the pre-draft on a second thread, checks that
every run's output is the same (lossless), and writes one JSON with the machine description.

    python benchmarks/predraft_engine.py --draft drafters/smollm2-135m-dflash-b16 --per-category 4 \\
        --max-new-tokens 64 --fanout 8 --out benchmarks/results/predraft/smollm2-135m-b16-engine.json

GPU model (one device, the pre-draft overlapped for free on the draft stream): with r = draft / verify
time of a step, hit rate h, and tau_p / tau_n the tau of pre-drafted / normal blocks, a step costs
``V + (1 - h) D`` instead of ``V + D`` and commits ``h tau_p + (1 - h) tau_n`` instead of ``tau_n``:
speedup = (h tau_p / tau_n + 1 - h) (1 + r) / (1 + (1 - h) r).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def gpu_speedup(h: float, tau_p: float, tau_n: float, r: float) -> float:
    return (h * tau_p / tau_n + 1 - h) * (1 + r) / (1 + (1 - h) * r)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafters/smollm2-135m-dflash-b16")
    p.add_argument("--prompts", default="../shared/data/spec_bench_questions.jsonl")
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--fanout", type=int, default=8)
    p.add_argument("--modes", default="off,seq,thread", help="comma-separated: off, seq, thread")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    from dflash_sglang.bench.machine import finish_result
    from dflash_sglang.core.engine import EngineConfig, ReferenceEngine
    from dflash_sglang.core.sampling import SamplingConfig
    from dflash_sglang.generate_cli import load_pair
    from dflash_sglang.models import fetch_model
    from dflash_sglang.prompts import chat_ids, eos_token_ids, first_per_category, load_prompts

    drafter, model, tok, target = load_pair(a.draft, str(fetch_model("smollm2-135m")))
    prompts = [chat_ids(tok, pr.text) for pr in first_per_category(load_prompts(a.prompts), a.per_category)]
    eos = eos_token_ids(model, tok)
    runs: dict[str, dict] = {}
    outputs: dict[str, list[list[int]]] = {}
    for mode in a.modes.split(","):
        fanout = 0 if mode == "off" else a.fanout
        cfg = EngineConfig(a.block_size, a.max_new_tokens, eos, predraft_fanout=fanout,
                           predraft_thread=mode == "thread")
        engine = ReferenceEngine(target, drafter, cfg)
        t0 = time.perf_counter()
        res = [engine.generate([ids], SamplingConfig.uniform(1))[0] for ids in prompts]
        secs = time.perf_counter() - t0
        tokens = sum(len(r.output_ids) for r in res)
        steps = sum(r.steps for r in res)
        outputs[mode] = [r.output_ids for r in res]
        runs[mode] = {"seconds": round(secs, 1), "tokens": tokens, "steps": steps,
                      "tau": round(sum(sum(r.committed_per_step) for r in res) / max(1, steps), 4),
                      "tok_s": round(tokens / secs, 3)}
        if engine.predrafter is not None:
            runs[mode]["predraft"] = engine.predrafter.stats.to_dict()
        print(mode, json.dumps(runs[mode]), flush=True)
    first = next(iter(outputs.values()))
    out: dict = {"prompts": len(prompts), "block_size": a.block_size, "fanout": a.fanout, "runs": runs,
                 "identical": all(o == first for o in outputs.values())}
    on = next((r["predraft"] for r in runs.values() if "predraft" in r), None)
    if on is not None:
        h = on["hit_rate"][f"F={a.fanout}"] if f"F={a.fanout}" in on["hit_rate"] else None
        if h is not None:
            out["gpu_model"] = {f"r={r}": round(gpu_speedup(h, on["tau_predrafted"], on["tau_normal"], r), 4)
                                for r in (0.1, 0.2, 0.3, 0.5)}
    if "off" in runs:
        out["cpu_speedup"] = {m: round(runs[m]["tok_s"] / runs["off"]["tok_s"], 3) for m in runs}
    finish_result(out, a, a.out)


if __name__ == "__main__":
    main()
