"""Scaling plots for a drafter's model card: held-out acceptance against training blocks and against
distinct training tokens, from the ``eval_tau.json`` files the training loop writes.

    python benchmarks/plot_drafter_scaling.py drafters/smollm2-135m-dflash-b16/training

reads ``stage3_eval_tau.json`` (the full run: 1,024 answers), ``data<N>_eval_tau.json`` for the N of
``ANSWER_TOKENS`` (the same recipe on the first N answers) and the warm-start runs of ``FRESH_RUNS``
(500-750 steps with ``--anchors fresh`` on a store grown with fresh text), and writes ``scaling.png``
beside them.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

BLOCKS_PER_STEP = 128
# answer tokens of the first N rows of data/distill/smollm2-135m (the store's uint16 ids)
ANSWER_TOKENS = {256: 73_470, 512: 144_960, 1024: 283_336}
# warm starts (500 steps, --anchors fresh): file stem -> (answers, answer tokens, started from)
FRESH_RUNS = {"data1664": (1664, 456_773, "stage 3"), "stage4": (1920, 491_482, "stage 3"),
              "stage5": (2944, 640_778, "stage 4"), "stage6": (3968, 792_321, "stage 5")}


def curve(path: Path, key: str = "heldout_acc_len") -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in json.loads(path.read_text())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = curve(a.folder / "stage3_eval_tau.json")
    subsets = {n: curve(f) for f in a.folder.glob("data*_eval_tau.json")
               if (n := int(re.search(r"data(\d+)_", f.name).group(1))) in ANSWER_TOKENS}
    subsets[1024] = full
    fig, (left, right, fresh) = plt.subplots(1, 3, figsize=(15, 4))
    steps = sorted(full)
    left.plot([s * BLOCKS_PER_STEP / 1000 for s in steps], [full[s] for s in steps], "o-")
    left.set(xlabel="training blocks (thousands)", ylabel="held-out acc_len", title="1,024 answers")
    for step in (250, 500):
        ns = sorted(n for n in subsets if step in subsets[n])
        right.plot([ANSWER_TOKENS[n] / 1000 for n in ns], [subsets[n][step] for n in ns], "o-",
                   label=f"{step * BLOCKS_PER_STEP // 1000}k blocks")
    right.set(xscale="log", xlabel="distinct answer tokens (thousands)", ylabel="held-out acc_len",
              title="same recipe, first N answers")
    right.legend()
    runs = [(stem, *FRESH_RUNS[stem]) for stem in FRESH_RUNS
            if (a.folder / f"{stem}_eval_tau.json").is_file()]
    xs = [tok / 1000 for _, _, tok, _ in runs]
    ends = [curve(a.folder / f"{stem}_eval_tau.json", "heldout_fresh_acc_len") for stem, *_ in runs]
    ys = [c[max(c)] for c in ends]  # each run's last evaluation
    fresh.plot(xs, ys, "o-")
    for x, y, c, (_, n, _, start) in zip(xs, ys, ends, runs, strict=True):
        fresh.annotate(f"{n} answers\n(from {start}, {max(c)} steps)", (x, y), textcoords="offset points",
                       xytext=(4, -18), fontsize=7)
    fresh.set(xscale="log", xlabel="answer tokens (thousands)", ylabel="held-out fresh-text acc_len",
              title="warm start, --anchors fresh")
    fig.tight_layout()
    fig.savefig(a.folder / "scaling.png", dpi=110)
    print(a.folder / "scaling.png")


if __name__ == "__main__":
    main()
