"""Per-position logit adjustments of a verify block, pinned to SGLang's own penalizers.

The reference: SGLang's BatchedPenalizerOrchestrator fed the history one token at a time, exactly as
its no-spec decode loop does, and applied to one logits row per block position. Ours: one call of
``adjust_block_logits`` over the whole block, with the orchestrator prepared but never advanced
(as it is under DFLASH).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.sampling.penaltylib import (
    BatchedFrequencyPenalizer,
    BatchedMinNewTokensPenalizer,
    BatchedPenalizerOrchestrator,
    BatchedPresencePenalizer,
    BatchedRepetitionPenalizer,
)
from sglang.srt.sampling.sampling_params import SamplingParams

from dflash_sglang.glue.logit_adjust import adjust_block_logits, needs_adjustment

V = 64
EOS = 3
PENALIZERS = {BatchedFrequencyPenalizer, BatchedMinNewTokensPenalizer, BatchedPresencePenalizer,
              BatchedRepetitionPenalizer}


def make_req(rng: random.Random, output_len: int) -> SimpleNamespace:
    sp = SamplingParams(
        max_new_tokens=256,
        frequency_penalty=rng.choice([0.0, 0.5, 1.5, -0.3]),
        presence_penalty=rng.choice([0.0, 0.7, 2.0]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
        min_new_tokens=rng.choice([0, output_len + 2, output_len + 40]),
        stop_token_ids=rng.choice([None, [5, 9]]),
    )
    tokenizer = SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS)
    out = [rng.randrange(12) for _ in range(output_len)]  # a small range: many repeats
    return SimpleNamespace(sampling_params=sp, eos_token_ids={EOS}, tokenizer=tokenizer, output_ids=out)


class FakeBatch:  # the orchestrator keeps a weak reference to its ScheduleBatch
    def __init__(self, reqs: list) -> None:
        self.reqs, self.device = reqs, torch.device("cpu")


def orchestrator(reqs: list) -> BatchedPenalizerOrchestrator:
    batch = FakeBatch(reqs)
    orch = BatchedPenalizerOrchestrator(vocab_size=V, batch=batch, penalizers=PENALIZERS)
    orch._keep_batch = batch  # the orchestrator holds the batch weakly
    return orch


def reference_rows(reqs: list, block: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """SGLang's sequential semantics, one request and one block row at a time: [bs, B, V]."""
    out = logits.clone()
    for b, req in enumerate(reqs):
        for j in range(block.shape[1]):
            orch = orchestrator([req])
            history = req.output_ids + block[b, 1:j + 1].tolist()
            for tok in history:  # no-spec feeds one output token per decode step
                orch.cumulate_output_tokens(torch.tensor([tok]))
            row = out[b, j].clone().view(1, V)
            if orch.is_required:  # as SGLang's forward copy applies them: additive, then scaling
                orch.apply(row, repeat=1)
            out[b, j] = row.view(V)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_block_penalties_equal_sglangs_sequential_penalizers(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    bs, nb = 5, 8
    reqs = [make_req(rng, output_len=rng.randrange(1, 30)) for _ in range(bs)]
    block = torch.randint(0, 12, (bs, nb))
    block[:, 0] = torch.tensor([r.output_ids[-1] for r in reqs])  # token 0: the last committed one
    logits = torch.randn(bs, nb, V) * 3
    info = SimpleNamespace(penalizer_orchestrator=None, logit_bias=None, has_custom_logit_processor=False)
    batch = SimpleNamespace(sampling_info=info, reqs=reqs)
    assert needs_adjustment(batch)
    ours = adjust_block_logits(batch, block, logits, None, [list(r.output_ids) for r in batch.reqs])
    want = reference_rows(reqs, block, logits)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(ours[finite], want[finite], rtol=1e-6, atol=1e-5)
    assert not torch.equal(ours, logits), "the random cases must exercise some penalty"


def test_logit_bias_is_added_at_every_position() -> None:
    bs, nb = 2, 4
    bias = torch.zeros(bs, V)
    bias[0, 7] = 100.0
    info = SimpleNamespace(penalizer_orchestrator=None, logit_bias=bias, has_custom_logit_processor=False)
    batch = SimpleNamespace(sampling_info=info, reqs=[])
    assert needs_adjustment(batch)
    logits = torch.randn(bs, nb, V)
    out = adjust_block_logits(batch, torch.zeros(bs, nb).long(), logits, None,
                              [list(r.output_ids) for r in batch.reqs])
    assert (out[0].argmax(-1) == 7).all()
    torch.testing.assert_close(out[1], logits[1])


def test_nothing_to_adjust_for_plain_requests() -> None:
    info = SimpleNamespace(penalizer_orchestrator=None, logit_bias=None, has_custom_logit_processor=False)
    req = SimpleNamespace(sampling_params=SamplingParams(max_new_tokens=8))
    assert not needs_adjustment(SimpleNamespace(sampling_info=info, reqs=[req]))
    assert not needs_adjustment(SimpleNamespace(sampling_info=None, reqs=[req]))
