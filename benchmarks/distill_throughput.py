"""Self-distillation throughput: answer tokens/s of the slot engine, and how many of them are fresh.

Re-answers ``--prompts`` stored prompts spread evenly over a distill store (their prompt ids, so no corpus
is needed) with ``train.fastgen.SlotGenerator`` exactly as ``dflash-sglang distill`` does (fp32, greedy,
``--batch-size`` slots, up to ``--max-new-tokens``), once per ``--stop-on-loop`` value, and reports
answer tokens/s and fresh tokens/s: answer tokens whose 15-token window does not repeat an earlier
one of the same answer (``benchmarks/store_repetition.py``'s measure).

    python benchmarks/distill_throughput.py --prompts 64 --stop-on-loop 0,32 --out /tmp/distill.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

WINDOW = 15


def fresh_count(answer: list[int], n: int = WINDOW) -> int:
    """Answer tokens that start a window not seen earlier in the answer (the last n - 1 count as fresh):
    ``train.recipe.fresh_positions``, the measure ``--anchors fresh`` trains on."""
    from dflash_sglang.train.recipe import fresh_positions

    return int(fresh_positions(torch.tensor(answer, dtype=torch.long), n).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default="data/distill/smollm2-135m")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--stop-on-loop", default="0,32", help="comma-separated W values (0: off)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    from dflash_sglang.bench.machine import describe_machine
    from dflash_sglang.core.target import load_hf_target
    from dflash_sglang.models import fetch_model
    from dflash_sglang.prompts import eos_token_ids
    from dflash_sglang.train.distill_store import DistillStore
    from dflash_sglang.train.fastgen import SlotGenerator

    model, tok = load_hf_target(str(fetch_model("smollm2-135m")))
    eos = eos_token_ids(model, tok)
    every = [s for shard in DistillStore.open(a.store).shard_paths() for s in _prompts(shard)]
    rows = every[:: max(1, len(every) // a.prompts)][: a.prompts]  # spread over the store's task mix
    runs = []
    for w in (int(x) for x in a.stop_on_loop.split(",")):
        gen = SlotGenerator(model, a.batch_size, 2048, a.max_new_tokens, eos, (), stop_on_loop=w)
        t0 = time.perf_counter()
        done = list(gen.run(list(enumerate(rows))))
        dt = time.perf_counter() - t0
        answers = [f.ids[f.prompt_len:] for f in done]
        tokens, fresh = sum(map(len, answers)), sum(fresh_count(x) for x in answers)
        runs.append({"stop_on_loop": w, "seconds": round(dt, 1), "answer_tokens": tokens,
                     "fresh_tokens": fresh, "tok_s": round(tokens / dt, 1),
                     "fresh_tok_s": round(fresh / dt, 1)})
        print(json.dumps(runs[-1]), flush=True)
    res = {"args": vars(a), "runs": runs, "machine": describe_machine()}
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


def _prompts(shard: Path) -> list[list[int]]:
    import numpy as np

    z = np.load(shard)
    return [z["ids"][o: o + p].astype("int64").tolist()
            for o, p in zip(z["offset"], z["prompt_len"], strict=True)]


if __name__ == "__main__":
    main()
