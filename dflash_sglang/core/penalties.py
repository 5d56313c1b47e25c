"""History-dependent logit adjustments at every position of a verify block (pure PyTorch).

A serving engine samples token t from the target logits adjusted by the output so far: frequency,
presence and repetition penalties, and min_new_tokens (stop tokens banned until enough output).
Verifying a block of B positions at once must score position j as if tokens 0..j-1 of the block had
already been emitted, since that is exactly the hypothesis under which position j's token is kept:

  row j of the block (predicting block token j+1) sees history = committed output + drafts[1..j]

(block token 0, the last committed token, is already part of the committed output).

Definitions (the OpenAI / SGLang ones), for a row whose history has count c[v] of token v and
length n:
  frequency   logit[v] -= frequency_penalty * c[v]
  presence    logit[v] -= presence_penalty * (c[v] > 0)
  repetition  logit[v] = logit[v] * r if logit[v] < 0 else logit[v] / r, for every v with c[v] > 0
  min_new     logit[v] = -inf for stop tokens v while n < min_new_tokens
The penalties are applied in a caller-given order (repetition does not commute with the additive
ones), so the result equals the engine's own sequential application bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PENALTIES = ("frequency", "presence", "repetition", "min_new_tokens")


@dataclass(frozen=True)
class PenaltyParams:
    """Per-row penalty parameters of the rows that have any (p rows of the batch)."""

    frequency: torch.Tensor  # [p] float32, 0 -> off
    presence: torch.Tensor  # [p] float32, 0 -> off
    repetition: torch.Tensor  # [p] float32, 1 -> off
    min_new_tokens: torch.Tensor  # [p] int64, 0 -> off
    stop_mask: torch.Tensor  # [p, V] bool: tokens banned while the output is shorter than min_new_tokens

    def __post_init__(self) -> None:
        p = self.frequency.shape
        if any(t.shape != p for t in (self.presence, self.repetition, self.min_new_tokens)):
            raise ValueError("frequency, presence, repetition and min_new_tokens must all be [p]")
        if self.stop_mask.dim() != 2 or self.stop_mask.shape[0] != p[0]:
            raise ValueError(f"stop_mask must be [p, V] with p={p[0]}, got {tuple(self.stop_mask.shape)}")


@dataclass(frozen=True)
class OutputHistory:
    """What each penalised row has emitted so far (committed output, prompt excluded)."""

    counts: torch.Tensor  # [p, V] float32: occurrences of each token in the committed output
    length: torch.Tensor  # [p] int64: number of committed output tokens

    @classmethod
    def from_ids(cls, outputs: Sequence[Sequence[int]], vocab: int,
                 device: torch.device | str) -> OutputHistory:
        """outputs: p lists of committed output token ids."""
        counts = torch.zeros((len(outputs), vocab), dtype=torch.float32, device=device)
        lengths = torch.tensor([len(o) for o in outputs], dtype=torch.int64, device=device)
        if int(lengths.sum()) > 0:
            rows = torch.repeat_interleave(torch.arange(len(outputs), device=device), lengths)
            ids = torch.tensor([t for o in outputs for t in o], dtype=torch.int64, device=device)
            counts.index_put_((rows, ids), torch.ones_like(ids, dtype=torch.float32), accumulate=True)
        return cls(counts, lengths)


def block_histories(history: OutputHistory, block_tokens: torch.Tensor) -> OutputHistory:
    """History seen by every block row: row j adds block tokens 1..j.

    history: p rows; block_tokens: [p, B] (token 0 already committed) -> counts [p, B, V], length [p, B].
    """
    p, nb = block_tokens.shape
    vocab = history.counts.shape[-1]
    added = torch.zeros((p, nb, vocab), dtype=torch.float32, device=block_tokens.device)
    if nb > 1:
        # Row j gets one count for each of block tokens 1..j: scatter each draft into its own row,
        # then a prefix sum over the rows.
        added[:, 1:].scatter_(-1, block_tokens[:, 1:].long().unsqueeze(-1), 1.0)
        added = added.cumsum(dim=1)
    counts = history.counts.unsqueeze(1) + added  # [p, B, V]
    length = history.length.view(-1, 1) + torch.arange(nb, device=block_tokens.device)  # [p, B]
    return OutputHistory(counts, length)


def apply_penalties(logits: torch.Tensor, hist: OutputHistory, params: PenaltyParams,
                    order: Sequence[str] = PENALTIES) -> torch.Tensor:
    """Penalised copy of logits [p, B, V] given the per-row histories of block_histories.

    ``order`` names the penalties in the order the engine applies them (each at most once)."""
    unknown = set(order) - set(PENALTIES)
    if unknown:
        raise ValueError(f"unknown penalties {sorted(unknown)}; known: {PENALTIES}")
    out = logits.float().clone()
    seen = hist.counts > 0  # [p, B, V]
    for name in order:
        if name == "frequency":
            out -= params.frequency.view(-1, 1, 1) * hist.counts
        elif name == "presence":
            out -= params.presence.view(-1, 1, 1) * seen
        elif name == "repetition":
            r = torch.where(seen, params.repetition.view(-1, 1, 1), 1.0)  # [p, B, V]
            out = torch.where(out < 0, out * r, out / r)
        else:  # min_new_tokens
            banned = (hist.length < params.min_new_tokens.view(-1, 1)).unsqueeze(-1)  # [p, B, 1]
            out = out.masked_fill(banned & params.stop_mask.unsqueeze(1), float("-inf"))
    return out.to(logits.dtype)
