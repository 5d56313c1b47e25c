"""The drafter's output head: rows of the target's LM head, optionally a frequent-token subset.

Drafting a block costs (B-1) x V x H multiply-adds in the borrowed LM head per request: for a
49k-vocabulary target on a CPU that is about the price of a target decode step. A drafter may
therefore come with a *draft vocabulary* (``draft_vocab.json`` beside its weights): the token ids it
may propose, typically the most frequent tokens of the target's own answers (the FR-Spec idea). The
head is then ``lm_head[ids]`` ([V', H]) and a draft is ``ids[argmax]``. Output stays exact: a greedy
draft is only a guess, and a sampled draft is verified against the very distribution q it was drawn
from (zero outside the subset, which rejection sampling allows: the residual max(p - q, 0) covers
those tokens). The file is extra; loaders that do not know it (SGLang's built-in DFlash worker)
draft over the whole vocabulary from the same weights.

The head's matmul dtype is chosen once: bf16 only where the CPU multiplies bf16 natively (AVX-512
BF16 / AMX). On an AVX2-only CPU torch emulates bf16 and a 15 x 576 x 49152 product measured 3x
slower than in fp32, so the fp32 target's own weights are used there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

VOCAB_FILE = "draft_vocab.json"


@cache
def cpu_has_native_bf16() -> bool:
    """AVX-512 BF16 or AMX-BF16 in /proc/cpuinfo (False where unreadable)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def head_dtype_for(weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype for drafting through ``weight``: bf16 for fp32 on CPUs with native bf16."""
    if weight.dtype == torch.float32 and weight.device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return weight.dtype


def load_draft_vocab(folder: str | Path) -> torch.Tensor | None:
    """The drafter folder's draft vocabulary [V'] (sorted, distinct token ids), None without one."""
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        return None
    ids = json.loads(path.read_text()).get("token_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"{path}: 'token_ids' must be a non-empty list of token ids")
    t = torch.tensor(sorted(set(ids)), dtype=torch.long)
    if len(t) != len(ids):
        raise ValueError(f"{path}: token_ids repeat")
    return t


def save_draft_vocab(folder: str | Path, ids: torch.Tensor, note: dict | None = None) -> Path:
    path = Path(folder) / VOCAB_FILE
    path.write_text(json.dumps({**(note or {}), "token_ids": sorted(int(i) for i in ids)}) + "\n")
    return path


@dataclass
class DraftHead:
    """``weight`` [V', H] rows ``ids`` [V'] of a [V, H] LM head (ids None: all V rows, in order)."""

    weight: torch.Tensor  # [V', H] in the drafting dtype
    ids: torch.Tensor | None  # [V'] long, sorted; None = identity
    vocab_size: int  # V
    source_version: int = -1  # the source tensor's version counter when ``weight`` was taken

    @classmethod
    def build(cls, lm_head: torch.Tensor, ids: torch.Tensor | None = None,
              dtype: torch.dtype | None = None) -> DraftHead:
        vocab = lm_head.shape[0]
        if ids is not None:
            ids = ids.to(lm_head.device)
            if int(ids.max()) >= vocab:
                raise ValueError(f"draft vocabulary has token id {int(ids.max())} >= vocab size {vocab}")
        dtype = dtype or head_dtype_for(lm_head)
        w = lm_head.detach() if ids is None else lm_head.detach()[ids]
        return cls(w.to(dtype), ids, vocab, lm_head._version)

    @classmethod
    def build_rows(cls, shard: torch.Tensor, ids: torch.Tensor, start: int, vocab_size: int,
                   dtype: torch.dtype) -> DraftHead:
        """The head over token ``ids`` [V'] from a vocabulary shard whose row i is token start + i."""
        return cls(shard.detach()[ids - start].to(dtype), ids, vocab_size, shard._version)

    def refreshed(self, lm_head: torch.Tensor) -> DraftHead:
        """Self, or a head rebuilt from ``lm_head`` when it was updated in place since (weight updates;
        a same-dtype full head shares storage with ``lm_head`` and rebuilds without copying)."""
        if lm_head._version == self.source_version:
            return self
        return DraftHead.build(lm_head, self.ids, self.weight.dtype)

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def to_tokens(self, index: torch.Tensor) -> torch.Tensor:
        """Row indices [...] -> token ids [...]."""
        return index if self.ids is None else self.ids[index]

    def columns(self, per_token: torch.Tensor) -> torch.Tensor:
        """A per-token tensor over the vocabulary [..., V] -> over the head's rows [..., V']."""
        return per_token if self.ids is None else per_token[..., self.ids.to(per_token.device)]

    def full(self, q: torch.Tensor) -> torch.Tensor:
        """Probabilities over the head's rows [..., V'] -> over the vocabulary [..., V] (0 elsewhere)."""
        if self.ids is None:
            return q
        out = q.new_zeros(*q.shape[:-1], self.vocab_size)
        return out.scatter_(-1, self.ids.expand(q.shape), q)

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the head's rows [..., V'] -> over the vocabulary [..., V] (-inf elsewhere)."""
        if self.ids is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return out.scatter_(-1, self.ids.expand(logits.shape), logits)

    def label_index(self) -> torch.Tensor:
        """[V] long: each token's row in the head, -1 for tokens outside it (training labels)."""
        idx = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.weight.device)
        rows = torch.arange(self.size, device=self.weight.device)
        return idx.index_copy_(0, self.ids, rows) if self.ids is not None else rows
