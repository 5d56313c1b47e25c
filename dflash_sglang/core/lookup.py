"""Context lookup drafts: where a request's newest tokens occurred before in its own text, propose what
followed them there, in place of the drafter's guess.

A small drafter copies poorly from its context: extraction, translation and RAG answers repeat long
spans of the prompt, and a small target's long answers repeat themselves, yet the DFlash drafter
accepts little there (Spec-Bench tau 1.1-1.2 in those categories with the shipped drafter). A lookup
in the committed text (prompt + output) finds those spans exactly:

  history  h[0..L-1], newest last; h[L-1] is the block's position 0 (the last committed token)
  match    the most recent j < L-k with h[j:j+k] == h[L-k:L], for k = max_ngram down to min_ngram
  draft    p[i] = h[j+k+i]; where j+k+i reaches L the text is periodic with period d = L-(j+k), so
           p[i] = p[i-d] (a loop is continued, not cut off at the end of the history)

Lossless either way: a lookup token is a deterministic proposal (q = one-hot), so greedy verification
and rejection sampling (accept with probability p(x), else resample from p without x) keep the
target's output and distribution exactly. Torch only: the reference engine and the SGLang worker
both call :func:`overlay_lookup`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LookupConfig:
    min_ngram: int = 1  # shortest suffix that may match (1: the last token alone)
    max_ngram: int = 4  # longest suffix tried first

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"lookup n-gram range {self.min_ngram}..{self.max_ngram}: "
                             "need 1 <= min_ngram <= max_ngram")


def lookup_continuation(history: Sequence[int], length: int, cfg: LookupConfig) -> list[int]:
    """history (token ids, newest last) -> ``length`` proposed next tokens, or [] when no suffix of
    min_ngram..max_ngram tokens occurred earlier.

    Host-only (no tensor reads, so no device sync): the ids are packed as 4-byte words and searched
    with ``bytes.rfind``; a hit off a word boundary is skipped."""
    n = len(history)
    if length < 1 or n < cfg.min_ngram + 1:
        return []
    text = array("I", history).tobytes()
    for k in range(min(cfg.max_ngram, n - 1), cfg.min_ngram - 1, -1):
        pattern = text[4 * (n - k):]
        end = 4 * (n - 1)  # an occurrence must end before the last token: it needs a successor
        while (at := text.rfind(pattern, 0, end)) >= 0 and at % 4:
            end = at + len(pattern) - 1
        if at >= 0:
            seen = list(history[at // 4 + k:])  # [d], d >= 1: the period of the continued text
            return (seen * -(-length // len(seen)))[:length]
    return []


def overlay_lookup(block: torch.Tensor, draft_probs: torch.Tensor | None,
                   histories: Sequence[Sequence[int]], cfg: LookupConfig) -> list[int]:
    """Replace the drafts of block [bs, B] (position 0: the last committed token, drafts at 1..B-1) by
    lookup continuations where one exists, in place; draft_probs [bs, B-1, V] (None: argmax drafts)
    gets one-hot rows at those positions, so sampled verification stays exact.

    histories[i]: request i's committed tokens, prompt + output, ending with block[i, 0]. -> lookup
    tokens placed per row [bs] (0 or B-1). Only writes to device tensors: nothing is read back."""
    bsz, nb = block.shape
    placed = [0] * bsz
    if nb < 2:
        return placed
    for i in range(bsz):
        prop = lookup_continuation(histories[i], nb - 1, cfg)  # [] or all B-1 drafts
        if not prop:
            continue
        ids = torch.tensor(prop, dtype=block.dtype).to(block.device, non_blocking=True)
        block[i, 1:] = ids
        if draft_probs is not None:
            draft_probs[i] = 0
            draft_probs[i].scatter_(-1, ids.to(draft_probs.device)[:, None], 1.0)
        placed[i] = len(prop)
    return placed


@dataclass
class LookupStats:
    """Steps and committed tokens of the rows that drafted by lookup, and of the rest."""

    lookup_steps: int = 0
    lookup_committed: int = 0
    drafter_steps: int = 0
    drafter_committed: int = 0

    def record(self, placed: Sequence[int], num_committed: torch.Tensor) -> None:
        """placed [bs] (overlay_lookup's result), num_committed [bs] (accept_len + 1)."""
        used = torch.tensor(placed, device=num_committed.device) > 0
        n = int(used.sum())
        self.lookup_steps += n
        self.drafter_steps += int(used.numel()) - n
        self.lookup_committed += int(num_committed[used].sum())
        self.drafter_committed += int(num_committed[~used].sum())

    def to_dict(self) -> dict[str, float | int]:
        def tau(c: int, s: int) -> float:
            return c / s if s else 0.0

        return {"lookup_steps": self.lookup_steps,
                "lookup_tau": tau(self.lookup_committed, self.lookup_steps),
                "drafter_steps": self.drafter_steps,
                "drafter_tau": tau(self.drafter_committed, self.drafter_steps)}
