"""Structured output inside a block: the grammar's token masks at every block position.

A constrained request's next token is drawn from the target distribution with the tokens its grammar
forbids removed (logit -inf). In a verify block [b, d1, ..., d(B-1)] position j predicts token j+1
from the history ``committed + d1..dj``, so its mask is the grammar's after accepting d1..dj.
``BlockGrammar`` walks each constrained request's matcher along the block, records one mask per
position, and rolls the matcher back, so verification scores every position exactly as the no-spec
server would score it at that point. The scheduler then advances the matcher over the committed
tokens (SGLang's own ``advance_grammar_fsm``, which also stops at grammar termination).

Two walks:
  * ``masks_along``: over a finished block (drafts chosen without the grammar). The walk stops at the
    first draft the grammar forbids: verification rejects it there (its target probability is 0), so
    later positions are never committed and keep an all-allowed mask.
  * ``draft_constrained``: drafting itself masked, position by position: the draft logits of position
    j are masked by the grammar state after d1..dj before d(j+1) is chosen, so the drafter never
    proposes a forbidden token. Its masks are then exactly the verification masks.

Invariant: every matcher is left in the state it had before the walk (accepts and rollbacks balance).
The grammar objects are duck-typed (SGLang's ``BaseGrammarObject``: ``allocate_vocab_mask``,
``fill_vocab_mask``, ``accept_token``, ``rollback``, ``is_terminated``; xgrammar's packed int32 bitmask,
bit t of word t // 32 set = token t allowed), so this module needs no SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class Grammar(Protocol):
    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: str) -> torch.Tensor: ...
    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None: ...
    def accept_token(self, token: int) -> None: ...
    def rollback(self, k: int) -> None: ...
    def is_terminated(self) -> bool: ...


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Packed int32 [..., W] -> bool [..., vocab]: True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # [..., W, 32]
    return bits.flatten(-2)[..., :vocab].bool()


def mask_logits_(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """In place: logits [..., V] get -inf where ``allowed`` [..., V] is False. Returns ``logits``."""
    return logits.masked_fill_(~allowed, float("-inf"))


@dataclass(frozen=True)
class BlockMasks:
    """The grammar masks of a block's constrained rows."""

    rows: torch.Tensor  # [g] long: batch rows that carry a live grammar
    allowed: torch.Tensor  # [g, B, V] bool: tokens allowed at each block position

    def apply_(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [bs, B, V], in place on the constrained rows. Returns ``logits``."""
        sub = logits[self.rows]
        logits[self.rows] = mask_logits_(sub, self.allowed.to(sub.device))
        return logits


class BlockGrammar:
    """The live grammars of one batch and a packed mask buffer for one block."""

    def __init__(self, grammars: Sequence[Grammar | None], nb: int, vocab: int) -> None:
        self.rows = [i for i, g in enumerate(grammars) if g is not None and not g.is_terminated()]
        self.grammars = [grammars[i] for i in self.rows]
        self.nb, self.vocab = nb, vocab
        first = self.grammars[0] if self.grammars else None
        # all bits set (-1) = every token allowed; rows a walk never fills keep that
        self.bitmask = first.allocate_vocab_mask(vocab, len(self.rows) * nb, "cpu") if first else None
        self._accepted = [0] * len(self.rows)
        self._live = [True] * len(self.rows)

    @classmethod
    def of(cls, grammars: Sequence[Grammar | None], nb: int, vocab: int) -> BlockGrammar | None:
        """None when no request of the batch is constrained (or every grammar has terminated)."""
        walk = cls(grammars, nb, vocab)
        return walk if walk.rows else None

    # ------------------------------------------------------------------ the walks
    def masks_along(self, tokens: torch.Tensor) -> BlockMasks:
        """tokens [bs, B] (column 0 committed, 1.. drafts) -> masks along each row's drafts."""
        host = tokens[self.rows].tolist()
        for j in range(self.nb):
            self._fill(j)
            if j + 1 < self.nb:
                self._advance([row[j + 1] for row in host], j)
        return self._finish(tokens.device)

    def draft_constrained(self, logits: torch.Tensor,
                          choose: Callable[[int, torch.Tensor], torch.Tensor],
                          to_allowed: Callable[[torch.Tensor], torch.Tensor]) -> BlockMasks:
        """Drafting under the grammar, one position at a time.

        logits [bs, B-1, V'] draft logits (masked in place on the constrained rows);
        ``to_allowed`` maps a full-vocabulary mask [g, V] to the draft head's columns [g, V'];
        ``choose(j, logits_j [bs, V'])`` picks the drafts of position j+1 for every row -> token ids
        [bs] (and may record their distribution). -> the verification masks along those drafts.
        """
        rows = torch.tensor(self.rows, dtype=torch.long, device=logits.device)
        for j in range(self.nb - 1):
            self._fill(j)
            allowed = to_allowed(self._allowed_at(j).to(logits.device))  # [g, V']
            # a row whose grammar allows no token of the draft head drafts unmasked (and is rejected)
            allowed |= ~allowed.any(-1, keepdim=True)
            logits[rows, j] = mask_logits_(logits[rows, j], allowed)
            drafted = choose(j, logits[:, j])  # [bs]
            self._advance(drafted[rows].tolist(), j)
        self._fill(self.nb - 1)
        return self._finish(logits.device)

    # ------------------------------------------------------------------ steps
    def _fill(self, j: int) -> None:
        for k, g in enumerate(self.grammars):
            if self._live[k] and not g.is_terminated():
                g.fill_vocab_mask(self.bitmask, k * self.nb + j)
            else:
                self._live[k] = False

    def _advance(self, next_tokens: list[int], j: int) -> None:
        """Accept each live row's token j+1 if its mask at j allows it; a forbidden one ends the walk."""
        words = self.bitmask.view(len(self.rows), self.nb, -1)[:, j]  # [g, W]
        for k, g in enumerate(self.grammars):
            if not self._live[k]:
                continue
            t = int(next_tokens[k])
            if 0 <= t < self.vocab and (int(words[k, t // 32]) >> (t % 32)) & 1:
                g.accept_token(t)
                self._accepted[k] += 1
            else:
                self._live[k] = False

    def _allowed_at(self, j: int) -> torch.Tensor:
        return unpack_bitmask(self.bitmask.view(len(self.rows), self.nb, -1)[:, j], self.vocab)

    def _finish(self, device: torch.device) -> BlockMasks:
        for k, g in enumerate(self.grammars):
            if self._accepted[k]:
                g.rollback(self._accepted[k])
        self._accepted = [0] * len(self.rows)
        self._live = [True] * len(self.rows)
        allowed = unpack_bitmask(self.bitmask.view(len(self.rows), self.nb, -1), self.vocab)
        return BlockMasks(torch.tensor(self.rows, dtype=torch.long, device=device), allowed.to(device))
