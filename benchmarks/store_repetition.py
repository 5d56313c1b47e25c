"""How much of a distill store's answers repeats earlier text of the same sequence (the target looping),
and how much of it occurs in another store (leakage between training and held-out data).

    python benchmarks/store_repetition.py data/distill/smollm2-135m-heldout \\
        --against data/distill/smollm2-135m
"""

from __future__ import annotations

import argparse
import glob
import json

import numpy as np
import torch

from dflash_sglang.train.recipe import fresh_positions


def answers(root: str) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, prompt length) of every stored row."""
    out = []
    for f in sorted(glob.glob(f"{root}/shard_*.npz")):
        z = np.load(f)
        for o, t, p in zip(z["offset"], z["total_len"], z["prompt_len"], strict=True):
            out.append((z["ids"][o: o + t].tolist(), int(p)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("--against", default=None, help="another store: answer n-grams found there")
    p.add_argument("-n", type=int, default=15, help="n-gram length")
    a = p.parse_args()
    n = a.n
    rows = answers(a.store)
    windows = repeated = looping = 0
    for seq, plen in rows:  # windows that end inside the answer; repeats may copy the prompt
        first = max(0, plen - n + 1)
        starts = max(0, len(seq) - n + 1 - first)
        r = int((~fresh_positions(torch.tensor(seq), n)[first: first + starts]).sum())
        windows += starts
        repeated += r
        looping += r > 0
    res = {"store": a.store, "n": n, "answers": len(rows), "answer_windows": windows,
           "repeat_earlier_window": round(repeated / max(1, windows), 4), "answers_with_repeats": looping}
    if a.against:
        other = {tuple(s[i: i + n]) for s, pl in answers(a.against) for i in range(pl, len(s) - n + 1)}
        found = sum(tuple(s[i: i + n]) in other for s, pl in rows for i in range(pl, len(s) - n + 1))
        res["found_in_other_store"] = found
    print(json.dumps(res))


if __name__ == "__main__":
    main()
