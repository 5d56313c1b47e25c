"""The target distribution the no-spec server would sample from, at every position of a verify block.

SGLang's decode step adjusts the target logits before sampling (``ModelRunner._preprocess_logits``
then ``Sampler._preprocess_logits``), in this order:
  1. the penalties from the committed output so far: the additive ones (frequency, presence,
     min_new_tokens), then the scaling one (repetition);
  2. the grammar mask of a structured-output request (``core.grammar``: per block position);
  3. ``logit_bias``;
  4. custom logit processors.
Verification must see the same adjusted logits, position by position. The penalties depend on the
tokens before each position, which inside a block include the earlier drafts: row j is scored with
the history ``committed output + drafts[1..j]`` (``core.penalties``). SGLang's own penalizer state is
not available here (the forward sees a copy of SamplingBatchInfo without the orchestrator) and is
not advanced under DFLASH anyway (its V2 decode preparation never cumulates output tokens), so the
counts come from the committed output and the parameters from each request's sampling params.

The caller passes the committed output of every request (``outputs``): under the overlap scheduler
``req.output_ids`` lags one step behind, so the worker completes it (``glue.history``). Invariant:
``outputs[i]`` holds every committed output token of request i, the block's token 0 (the last bonus)
included.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..core.grammar import BlockMasks
from ..core.penalties import OutputHistory, PenaltyParams, apply_penalties, block_histories

# SGLang's forward copy of SamplingBatchInfo (``copy_for_forward``) folds the penalizers into one
# additive tensor and one scaling tensor, applied in that order: additive penalties first.
ORDER = ("frequency", "presence", "min_new_tokens", "repetition")


def needs_adjustment(batch: Any) -> bool:
    """Host-side: does any request of the batch carry a logit adjustment?"""
    info = batch.sampling_info
    if info is None:
        return False
    return bool(info.logit_bias is not None or info.has_custom_logit_processor
                or any(_has_penalty(r.sampling_params) for r in batch.reqs))


def needs_history(req: Any) -> bool:
    """Host-side: does the request's adjustment read its committed output (penalties, processors)?"""
    return _has_penalty(req.sampling_params) or getattr(req, "custom_logit_processor", None) is not None


def adjust_block_logits(batch: Any, block_tokens: torch.Tensor, logits: torch.Tensor,
                        grammar: BlockMasks | None, outputs: list[list[int]]) -> torch.Tensor:
    """block_tokens [bs, B], logits [bs, B, V] (raw target) -> adjusted logits [bs, B, V] (a copy).

    outputs: each request's committed output ids (``CommittedHistory.outputs``; ``req.output_ids``
    alone lags a step under the overlap scheduler)."""
    info = batch.sampling_info
    bs, nb, vocab = logits.shape
    out = logits.clone()
    _apply_penalties(batch.reqs, outputs, block_tokens, out)
    if grammar is not None:
        grammar.apply_(out)
    if info.logit_bias is not None:
        out += info.logit_bias.to(out.dtype).view(bs, 1, vocab)
    if info.has_custom_logit_processor:
        _apply_custom_processors(batch.reqs, outputs, info, block_tokens, out)
    return out


def _apply_custom_processors(reqs: list, outputs: list[list[int]], info: Any, block_tokens: torch.Tensor,
                             out: torch.Tensor) -> None:
    """SGLang's custom logit processors, one block row at a time (in place on ``out`` [bs, B, V]).

    A processor may read the request's history (``custom_params["__req__"].output_ids``), so for row j
    each request's ``output_ids`` temporarily holds the committed output plus drafts[1..j]."""
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    committed = [r.output_ids for r in reqs]
    drafts = block_tokens[:, 1:].tolist()  # host copy: processors are host code
    try:
        for j in range(out.shape[1]):
            for r, base, full, d in zip(reqs, committed, outputs, drafts, strict=True):
                r.output_ids = _extended(base, full[len(base):] + d[:j])
            row = out[:, j].contiguous()  # [bs, V]
            apply_custom_logit_processor(row, info)
            out[:, j] = row
    finally:
        for r, base in zip(reqs, committed, strict=True):
            r.output_ids = base


def _apply_penalties(reqs: list, outputs: list[list[int]], block_tokens: torch.Tensor,
                     out: torch.Tensor) -> None:
    """Penalise (in place) the rows of ``out`` [bs, B, V] whose requests carry a penalty."""
    rows = [i for i, r in enumerate(reqs) if _has_penalty(r.sampling_params)]
    if not rows:
        return
    device, vocab = out.device, out.shape[-1]
    idx = torch.tensor(rows, dtype=torch.int64, device=device)
    params = _penalty_params([reqs[i] for i in rows], vocab, device)
    history = OutputHistory.from_ids([outputs[i] for i in rows], vocab, device)
    hist = block_histories(history, block_tokens[idx])
    out[idx] = apply_penalties(out[idx], hist, params, ORDER)


def _extended(ids: Any, more: list[int]) -> Any:
    """A copy of ``ids`` (a list or an ``array``, as SGLang keeps output_ids) with ``more`` appended."""
    out = copy.copy(ids)
    out.extend(more)
    return out


def _has_penalty(sp: Any) -> bool:
    return bool(sp.frequency_penalty != 0.0 or sp.presence_penalty != 0.0 or sp.repetition_penalty != 1.0
                or sp.min_new_tokens > 0)


def stop_token_ids(req: Any) -> set[int]:
    """The tokens min_new_tokens bans: SGLang's stop set (request, model EOS, tokenizer EOS)."""
    tok = req.tokenizer
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
    if getattr(tok, "eos_token_id", None) is not None:
        ids.add(tok.eos_token_id)
    return {int(t) for t in ids if t is not None}


def _penalty_params(reqs: list, vocab: int, device: torch.device) -> PenaltyParams:
    """The penalised requests' parameters, read from their sampling params."""
    sps = [r.sampling_params for r in reqs]
    stop_mask = torch.zeros((len(reqs), vocab), dtype=torch.bool, device=device)
    for row, r in enumerate(reqs):
        if r.sampling_params.min_new_tokens > 0:
            stop_mask[row, [t for t in stop_token_ids(r) if 0 <= t < vocab]] = True

    def col(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([getattr(sp, name) for sp in sps], dtype=dtype, device=device)

    return PenaltyParams(
        frequency=col("frequency_penalty", torch.float32),
        presence=col("presence_penalty", torch.float32),
        repetition=col("repetition_penalty", torch.float32),
        min_new_tokens=col("min_new_tokens", torch.int64),
        stop_mask=stop_mask)
