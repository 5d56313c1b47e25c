"""Pre-drafting in the reference engine (issue #20): hit rate by F, tau of pre-drafted against normal
blocks, CPU wall-clock with and without, and the GPU speedup those numbers imply.

Runs the same prompts (Spec-Bench first turns, greedy, batch 1) through ``ReferenceEngine`` with
pre-drafting off, on (F guesses, sequential) and on with the pre-draft on a second thread, checks that
every run's output is the same (lossless), and writes one JSON with the machine description.

    python benchmarks/predraft_engine.py --draft drafters/smollm2-135m-dflash-b16 --per-category 4 \\
        --max-new-tokens 64 --fanout 8 --out benchmarks/results/predraft/smollm2-135m-b16-engine.json

GPU model (one device): with r = draft / verify time of a step and hit rate h, a step commits
``t = tau_on / tau_off`` times as many tokens as without pre-drafting (measured: both runs decode the
same prompts; a hit's pre-draft lacks block n's target features, so it can be worse than the draft it
replaces), and costs
- ``V + (1 - h) D`` instead of ``V + D`` if the pre-draft on the side stream is free (upper bound):
  speedup = t (1 + r) / (1 + (1 - h) r);
- ``V + D + (1 - h) D`` if both streams are bound by the same memory bandwidth (batch 1 decoding is:
  the pre-draft pass reads the drafter's weights once for all F rows, so it costs about one D):
  speedup = t (1 + r) / (1 + (2 - h) r).
r is given at 0.1 .. 0.5 and as the weight-bytes ratio of ``scripts/gpu_check.py``'s serving shapes
(``weight_stream_r``: the bytes a bandwidth-bound pass streams, draft pass over verify pass).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

# scripts/gpu_check.py's QWEN3_8B shapes: a dense 36-layer Qwen3-8B target, a 5-layer drafter on 5 taps
GPU_CHECK_SHAPES = {"hidden": 4096, "q": 32 * 128, "kv": 8 * 128, "inter": 12288, "target_layers": 36,
                    "draft_layers": 5, "taps": 5, "vocab": 151936}


def weight_stream_r(s: dict[str, int]) -> float:
    """Weights one draft pass reads over those one verify pass reads (both read the LM head rows they
    score; the drafter also its fc): the draft / verify time ratio of bandwidth-bound decoding."""
    layer = s["hidden"] * (2 * s["q"] + 2 * s["kv"]) + 3 * s["hidden"] * s["inter"]
    target = s["target_layers"] * layer + s["vocab"] * s["hidden"]
    draft = s["draft_layers"] * layer + s["taps"] * s["hidden"] ** 2 + s["vocab"] * s["hidden"]
    return draft / target


def gpu_speedup(h: float, tau_ratio: float, r: float, shared_bandwidth: bool = False) -> float:
    cost = 1 + ((2 - h) if shared_bandwidth else (1 - h)) * r
    return tau_ratio * (1 + r) / cost


def gpu_model(h: float, tau_ratio: float) -> dict:
    r_shapes = round(weight_stream_r(GPU_CHECK_SHAPES), 4)
    rs = (0.1, 0.2, 0.3, 0.5, r_shapes)
    return {"hit_rate": h, "tau_on_over_off": round(tau_ratio, 4), "r_gpu_check_shapes": r_shapes,
            "free_overlap": {f"r={r}": round(gpu_speedup(h, tau_ratio, r), 4) for r in rs},
            "shared_bandwidth": {f"r={r}": round(gpu_speedup(h, tau_ratio, r, True), 4) for r in rs}}


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
    mode_on = next((m for m, r in runs.items() if "predraft" in r), None)
    if mode_on is not None and "off" in runs and f"F={a.fanout}" in runs[mode_on]["predraft"]["hit_rate"]:
        h = runs[mode_on]["predraft"]["hit_rate"][f"F={a.fanout}"]
        out["gpu_model"] = gpu_model(h, runs[mode_on]["tau"] / runs["off"]["tau"])
    if "off" in runs:
        out["cpu_speedup"] = {m: round(runs[m]["tok_s"] / runs["off"]["tok_s"], 3) for m in runs}
    finish_result(out, a, a.out)


if __name__ == "__main__":
    main()
