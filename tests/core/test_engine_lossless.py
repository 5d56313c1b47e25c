"""The reference engine is lossless: token ids equal the target's own greedy output (HF generate)."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.drafter import DFlashDrafter
from dflash_sglang.core.engine import EngineConfig, ReferenceEngine, autoregressive_generate
from dflash_sglang.core.lookup import LookupConfig
from dflash_sglang.core.sampling import SamplingConfig
from dflash_sglang.core.target import HFTarget

EOS = (2,)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy output, via transformers' generate at batch 1, cut after EOS."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            pad_token_id=0,
        )
    ids = out[0, len(prompt) :].tolist()
    return ids[: ids.index(2) + 1] if 2 in ids else ids


@pytest.fixture(scope="module")
def reference_64(smollm2, spec_bench_ids) -> list[list[int]]:
    model, _ = smollm2
    return [hf_greedy(model, p, 64) for p in spec_bench_ids[:20]]


class CheatingEngine(ReferenceEngine):
    """Drafts the true continuation with one corrupted position per block: accept lengths vary 0..B-1."""

    def __init__(self, *a, truth: list[list[int]], seed: int = 0, **kw) -> None:
        super().__init__(*a, **kw)
        self.truth, self.rng = truth, torch.Generator().manual_seed(seed)

    def _draft(self, b, generator):
        block, _, logits = super()._draft(b, generator)
        nb = block.shape[1]
        for row, r in enumerate(b.req.tolist()):
            done = int(b.n[row]) - self.prompt_lens[r]  # outputs committed so far
            want = (self.truth[r] + [0] * nb)[done : done + nb - 1]
            block[row, 1:] = torch.tensor(want)
            bad = int(torch.randint(1, nb + 2, (1,), generator=self.rng))  # > nb-1: no corruption
            if bad < nb:
                block[row, bad] = (block[row, bad] + 1) % 49152
        return block, None, logits

    def generate(self, prompts, sampling, generator=None):
        self.prompt_lens = [len(p) for p in prompts]
        return super().generate(prompts, sampling, generator)


def test_cheating_drafter_exercises_acceptance(smollm2, spec_bench_ids, random_drafter_16, reference_64):
    model, _ = smollm2
    target = HFTarget(model, random_drafter_16.cfg.target_layer_ids)
    prompts, truth = spec_bench_ids[:4], reference_64[:4]
    eng = CheatingEngine(target, random_drafter_16, EngineConfig(8, 64, EOS, "target_only"), truth=truth)
    res = eng.generate(prompts, SamplingConfig.uniform(4))
    assert [r.output_ids for r in res] == truth
    per_step = [k for r in res for k in r.committed_per_step]
    assert sum(per_step) / len(per_step) > 3.0, per_step  # acceptance really happened
    assert {1, 8} <= set(per_step) and len(set(per_step)) >= 5  # ragged: full and partial blocks


@pytest.mark.parametrize("block", [4, 8, 16])
def test_random_drafter_lossless_batch1_quick(
    smollm2, spec_bench_ids, random_drafter_16, reference_64, block
):
    model, _ = smollm2
    target = HFTarget(model, random_drafter_16.cfg.target_layer_ids)
    eng = ReferenceEngine(target, random_drafter_16, EngineConfig(block, 64, EOS))
    got = eng.generate(spec_bench_ids[:2], SamplingConfig.uniform(2))
    assert [r.output_ids for r in got] == reference_64[:2]


@pytest.mark.slow
# Two of the six (block, batch) pairs: each pair costs 2-5 minutes on 2 cores (a random drafter commits
# about one token per step) and the quick test above already covers every block at batch 1.
@pytest.mark.parametrize(("block", "batch"), [(16, 1), (8, 4)])
def test_random_drafter_lossless_20_prompts(
    smollm2, spec_bench_ids, random_drafter_16, reference_64, block, batch
):
    model, _ = smollm2
    target = HFTarget(model, random_drafter_16.cfg.target_layer_ids)
    eng = ReferenceEngine(target, random_drafter_16, EngineConfig(block, 64, EOS))
    prompts = spec_bench_ids[:20]
    got: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        got.extend(r.output_ids for r in eng.generate(chunk, SamplingConfig.uniform(len(chunk))))
    mismatches = [i for i, (g, w) in enumerate(zip(got, reference_64, strict=True)) if g != w]
    assert not mismatches, f"prompts {mismatches} differ from the target's greedy output"


@pytest.mark.parametrize("block", [4, 16])
def test_lookup_drafts_are_lossless_and_accepted(
    smollm2, spec_bench_ids, random_drafter_16, reference_64, block
):
    """Context lookup over a random drafter: the output is still the target's greedy output, batched,
    and the lookup rows commit more than one token per step (the random drafter's rows commit ~1)."""
    model, _ = smollm2
    target = HFTarget(model, random_drafter_16.cfg.target_layer_ids)
    eng = ReferenceEngine(target, random_drafter_16, EngineConfig(block, 64, EOS, lookup=LookupConfig(1, 4)))
    got = eng.generate(spec_bench_ids[:4], SamplingConfig.uniform(4))
    assert [r.output_ids for r in got] == reference_64[:4]
    st = eng.lookup_stats.to_dict()
    assert st["lookup_steps"] > 0 and st["lookup_tau"] > 1.2 > st["drafter_tau"], st


def test_plain_decoding_equals_hf_generate(smollm2, spec_bench_ids, reference_64):
    model, _ = smollm2
    target = HFTarget(model, (1,))
    got = autoregressive_generate(target, spec_bench_ids[:3], 64, EOS, SamplingConfig.uniform(3))
    assert got == reference_64[:3]


def test_drafter_mismatch_refused(smollm2, random_drafter_16):
    from dflash_sglang.core.config import DFlashConfigError

    model, _ = smollm2
    cfg = random_drafter_16.cfg
    bad = DFlashDrafter(type(cfg)(**{**cfg.__dict__, "target_layer_ids": (1, 40)}))
    with pytest.raises(DFlashConfigError, match="target_layer_ids"):
        ReferenceEngine(HFTarget(model, (1,)), bad, EngineConfig(8, 8, EOS))


@pytest.mark.parametrize("head", ["bf16", "subset"])
def test_trained_drafter_with_cheaper_draft_heads_is_lossless(smollm2, spec_bench_ids, reference_64, head):
    """Drafting through a bf16 copy of the LM head, or through a draft vocabulary of 8192 of the
    49152 tokens (the ids below 8192: most but not all of what the target writes), is still exactly
    the target's greedy output."""
    from pathlib import Path

    drafter = DFlashDrafter.from_pretrained(Path(__file__).resolve().parents[2] / "drafters" /
                                            "smollm2-135m-dflash-b16")
    model, _ = smollm2
    target = HFTarget(model, drafter.cfg.target_layer_ids)
    if head == "subset":
        drafter.draft_vocab = torch.arange(8192)
        assert any(t >= 8192 for r in reference_64[:3] for t in r)  # some tokens can never be drafted
    else:
        drafter.draft_vocab = None  # the whole head, in bf16 (the shipped drafter has a 16,384-token subset)
    dtype = torch.bfloat16 if head == "bf16" else torch.float32
    eng = ReferenceEngine(target, drafter, EngineConfig(8, 64, EOS, draft_head_dtype=dtype))
    assert eng.head.weight.dtype == dtype and target.lm_head_weight.dtype == torch.float32
    assert eng.head.size == (8192 if head == "subset" else 49152)
    got = eng.generate(spec_bench_ids[:3], SamplingConfig.uniform(3))
    assert [r.output_ids for r in got] == reference_64[:3]
    per_step = [k for r in got for k in r.committed_per_step]
    assert max(per_step) > 1  # drafts were accepted: the cheaper head drafts real tokens
