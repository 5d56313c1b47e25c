"""The drafter's output head and input embedding on this rank, borrowed from the target.

At tensor parallelism 1 the head is the target's whole LM head (or its draft-vocabulary rows,
``core.draft_head``). Under tensor parallelism the target's embedding and LM head are vocabulary
shards: the block is embedded through the target's own ``VocabParallelEmbedding`` (masked lookup,
then an all-reduce), and drafting goes through this rank's slice of the head with a split-vocabulary
argmax or gathered logits (``core.vocab_split``). Every rank ends with the same drafts.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.config import DFlashConfigError
from ..core.draft_head import DraftHead
from ..core.drafter import DFlashDrafter
from ..core.vocab_split import VocabSplit


def tp_group() -> Any | None:
    """SGLang's tensor-parallel group, None where no parallel state exists (a model class built
    outside a server, as in unit tests): that is tensor parallelism 1. Asked once, at start-up."""
    from sglang.srt.distributed.parallel_state import get_tp_group

    try:
        return get_tp_group()
    except RuntimeError:  # "parallel name 'tp_group' has not been written in this process"
        return None


class DraftVocab:
    def __init__(self, target: Any, draft_ids: torch.Tensor | None, vocab_size: int) -> None:
        self.embedding = target.get_input_embeddings()  # the target's module: ids [N] -> [N, H]
        head = getattr(target, "lm_head", None)
        self.weight = getattr(head, "weight", None)  # [V or V/tp (+ padding), H]
        if self.weight is None:
            raise DFlashConfigError(
                "the target model exposes no lm_head.weight; DFLASH borrows the target's LM head")
        group = tp_group()
        self.tp = group.world_size if group is not None else 1
        self.head: DraftHead | None = None
        self.split: VocabSplit | None = None
        if self.tp == 1:
            self.head = DraftHead.build(self.weight, draft_ids)
        else:
            self.split = _split(head, self.weight, vocab_size, draft_ids, group)

    @property
    def size(self) -> int:
        """Tokens the drafter may propose (V', over all ranks)."""
        return self.head.size if self.head is not None else self.split.whole.ids.numel()

    @property
    def whole_head(self) -> DraftHead:
        """The head whose columns ``whole_logits`` returns (token ids, ``full``, ``columns``)."""
        return self.head if self.head is not None else self.split.whole

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [N] -> the target's input embeddings [N, H] (identical on every rank)."""
        return self.embedding(ids)

    def logits(self, drafter: DFlashDrafter, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> this rank's draft logits [..., V'_r] (all V' at tp 1)."""
        if self.head is not None:
            self.head = self.head.refreshed(self.weight)  # follows in-place weight updates
            return drafter.logits(hidden.to(self.head.weight.dtype), self.head.weight)
        self.split = self.split.refreshed(self.weight)
        return drafter.logits(hidden.to(self.split.local.weight.dtype), self.split.local.weight)

    def argmax_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits [..., V'_r] -> the greedy draft token ids [...] (all ranks agree)."""
        if self.head is not None:
            return self.head.to_tokens(logits.argmax(-1))
        return self.split.argmax_tokens(logits)

    def whole_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits [..., V'_r] -> [..., V'] over ``whole_head``'s rows."""
        return logits if self.split is None else self.split.gathered(logits)


def _split(head: Any, weight: torch.Tensor, vocab_size: int, draft_ids: torch.Tensor | None,
           group: Any) -> VocabSplit:
    shard = getattr(head, "shard_indices", None)
    if shard is None:
        raise DFlashConfigError(
            f"tensor parallelism: the target's LM head ({type(head).__name__}) has no shard_indices; "
            "DFLASH drafts through a vocabulary-parallel head")
    start, end = int(shard.org_vocab_start_index), int(shard.org_vocab_end_index)
    return VocabSplit.build(weight, start, end, vocab_size, draft_ids,
                            lambda t: group.all_gather(t.contiguous(), dim=-1))
