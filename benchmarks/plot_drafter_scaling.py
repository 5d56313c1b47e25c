"""Scaling plots for a drafter's model card: held-out acceptance against training blocks and against
distinct training tokens, from the ``eval_tau.json`` files the training loop writes.

    python benchmarks/plot_drafter_scaling.py drafters/smollm2-135m-dflash-b16/training

reads ``stage3_eval_tau.json`` (the full run: 1,024 answers) and ``data<N>_eval_tau.json`` (the same
recipe on the first N answers), and writes ``scaling.png`` beside them.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

BLOCKS_PER_STEP = 128
# answer tokens of the first N rows of data/distill/smollm2-135m (the store's uint16 ids)
ANSWER_TOKENS = {256: 73_470, 512: 144_960, 1024: 283_336}


def curve(path: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["heldout_acc_len"]) for r in json.loads(path.read_text())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = curve(a.folder / "stage3_eval_tau.json")
    subsets = {int(re.search(r"data(\d+)_", f.name).group(1)): curve(f)
               for f in a.folder.glob("data*_eval_tau.json")}
    subsets[1024] = full
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
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
    fig.tight_layout()
    fig.savefig(a.folder / "scaling.png", dpi=110)
    print(a.folder / "scaling.png")


if __name__ == "__main__":
    main()
