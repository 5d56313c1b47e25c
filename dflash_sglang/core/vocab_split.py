"""Drafting over a vocabulary split across tensor-parallel ranks (torch only).

Under tensor parallelism the target's LM head is split by vocabulary: rank r holds the rows of token ids
[start_r, end_r), contiguous and in rank order. Each rank projects the drafter's hidden states through
its own rows (optionally only those in the draft vocabulary), so it sees logits for its slice only:

* greedy drafting takes each rank's (max, token id) and gathers those ``tp`` pairs, not the logits;
  the first maximum across ranks is the lowest token id among ties, as ``argmax`` over the whole row;
* sampled drafting and grammar masking gather every rank's logits into one row over the draft
  vocabulary, ordered by token id, and every rank then draws the same token with the same generator.

``gather`` is the caller's all-gather along the last dim (``[..., k]`` on each rank ->
``[..., tp * k]`` in rank order); SGLang's tensor-parallel group in the worker, a plain function in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .draft_head import DraftHead, head_dtype_for

Gather = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class VocabSplit:
    """This rank's share of a draft head and how to put the ranks' shares together."""

    local: DraftHead  # this rank's rows: weight [V'_r, H], ids [V'_r] global token ids
    whole: DraftHead  # the gathered view: ids [V'] (all ranks, sorted); its weight is not used
    start: int  # the shard's first token id
    padded_ids: torch.Tensor  # [width] this rank's token ids, -1 past them
    keep: torch.Tensor  # [V'] long: the columns of a gathered [tp * width] row that are real
    gather: Gather

    @property
    def width(self) -> int:  # columns per rank in a gathered row (max V'_r; shorter ranks pad -inf)
        return self.padded_ids.numel()

    @classmethod
    def build(cls, shard: torch.Tensor, start: int, end: int, vocab_size: int, ids: torch.Tensor | None,
              gather: Gather, dtype: torch.dtype | None = None) -> VocabSplit:
        """shard [>= end - start, H]: this rank's LM-head rows (row i is token start + i; rows past
        end - start are padding); ids: the draft vocabulary [V'] (None: every token)."""
        mine = torch.arange(start, end, device=shard.device)
        if ids is not None:
            ids = ids.to(shard.device)
            mine = ids[(ids >= start) & (ids < end)]
        local = DraftHead.build_rows(shard, mine, start, vocab_size, dtype or head_dtype_for(shard))
        n = torch.tensor([float(mine.numel())], dtype=torch.float64, device=shard.device)
        counts = [int(c) for c in gather(n).tolist()]  # start-up only
        width = max(max(counts), 1)
        padded = torch.full((width,), -1, dtype=torch.long, device=shard.device)
        padded[: mine.numel()] = mine
        every = gather(padded.to(torch.float64))  # [tp * width]; ids < 2**53 are exact
        keep = torch.cat([torch.arange(r * width, r * width + c, device=shard.device)
                          for r, c in enumerate(counts)])
        all_ids = every[keep].long()
        whole = DraftHead(shard.new_empty(all_ids.numel(), 0), all_ids, vocab_size, -1)
        return cls(local, whole, start, padded, keep, gather)

    def refreshed(self, shard: torch.Tensor) -> VocabSplit:
        """Self, or rebuilt rows when ``shard`` was updated in place since (weight updates)."""
        if shard._version == self.local.source_version:
            return self
        local = DraftHead.build_rows(shard, self.local.ids, self.start, self.local.vocab_size,
                                     self.local.weight.dtype)
        return VocabSplit(local, self.whole, self.start, self.padded_ids, self.keep, self.gather)

    def _padded(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V'_r] -> [..., width] (-inf columns past this rank's rows)."""
        short = self.width - logits.shape[-1]
        if short == 0:
            return logits
        return torch.cat([logits, logits.new_full((*logits.shape[:-1], short), float("-inf"))], dim=-1)

    def argmax_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits [..., V'_r] -> the token id of the maximum over all ranks [...]."""
        best, row = self._padded(logits).max(-1)
        pairs = torch.stack([best.double(), self.padded_ids[row].double()], dim=-1)  # ids exact
        every = self.gather(pairs).view(*best.shape, -1, 2)  # [..., tp, 2]
        winner = every[..., 0].argmax(-1, keepdim=True)  # first maximum: the lowest rank, lowest id
        return every[..., 1].gather(-1, winner).squeeze(-1).long()

    def gathered(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits [..., V'_r] -> all ranks' [..., V'], columns as ``whole.ids``."""
        return self.gather(self._padded(logits)).index_select(-1, self.keep)
