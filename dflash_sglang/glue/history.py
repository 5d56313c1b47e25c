"""Each request's committed output as the worker itself committed it, ahead of SGLang's ``output_ids``.

SGLang appends a step's tokens to ``req.output_ids`` when it processes that step's result. The
non-overlap loop does so before the next forward; the overlap loop (SGLang's default) runs step n's
forward first and processes step n-1's result afterwards, so at step n ``output_ids`` lacks step
n-1's tokens. The history-dependent logit adjustments (penalties, min_new_tokens, custom processors;
``logit_adjust``) must see every committed token, so the worker keeps its own trail per request:

  prefill   trail = output_ids at prefill (complete: nothing of this request is in flight) + the token
            the prefill sampled
  decode    trail += the tokens the step committed

Invariant: ``req.output_ids`` is a prefix of the trail (equal to it once SGLang has processed every
result), except after a stop cut a step short, which finishes the request. Tokens stay on the device
until a read needs them: one host copy per read for the whole batch, and only requests with a
history-dependent adjustment are tracked (the caller decides which).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class _Trail:
    host: list[int]  # committed output tokens already on the host
    steps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # ([n] -1 padded, [] count)


class CommittedHistory:
    """Weakly keyed by request: a finished request's trail goes with it."""

    def __init__(self) -> None:
        self._trails: weakref.WeakKeyDictionary[Any, _Trail] = weakref.WeakKeyDictionary()

    def start(self, reqs: list[Any], rows: list[int], first: torch.Tensor) -> None:
        """After a prefill: first [bs] is the token each request's prefill sampled."""
        one = torch.ones((), dtype=torch.int64, device=first.device)
        for i in rows:
            self._trails[reqs[i]] = _Trail(list(reqs[i].output_ids), [(first[i].view(1), one)])

    def extend(self, reqs: list[Any], rows: list[int], committed: torch.Tensor, counts: torch.Tensor) -> None:
        """After a decode step: committed [bs, B] (-1 padded), counts [bs]."""
        for i in rows:
            trail = self._trails.get(reqs[i])
            if trail is None:  # not seen at prefill (tracking began later): SGLang's view is all there is
                trail = self._trails[reqs[i]] = _Trail(list(reqs[i].output_ids))
            trail.steps.append((committed[i], counts[i]))

    def outputs(self, reqs: list[Any]) -> list[list[int]]:
        """Every committed output token of each request (``output_ids`` for untracked requests)."""
        trails = [self._trails.get(r) for r in reqs]
        self._to_host([t for t in trails if t is not None and t.steps])
        return [list(t.host) if t is not None else list(r.output_ids)
                for r, t in zip(reqs, trails, strict=True)]

    @staticmethod
    def _to_host(trails: list[_Trail]) -> None:
        steps = [s for t in trails for s in t.steps]
        if not steps:
            return
        width = max(tok.numel() for tok, _ in steps)
        tokens = torch.stack([torch.nn.functional.pad(tok, (0, width - tok.numel()), value=-1)
                              for tok, _ in steps]).tolist()  # one host copy for the batch
        counts = torch.stack([n for _, n in steps]).tolist()
        k = 0
        for t in trails:
            for _ in t.steps:
                t.host.extend(tokens[k][: int(counts[k])])
                k += 1
            t.steps.clear()
