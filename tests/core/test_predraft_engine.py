"""Pre-drafting in the reference engine (issue #20): the pre-draft's input, its use on a hit, and that
output stays lossless with it on (greedy ids against the target's own; the sampled law exactly)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dflash_sglang.core.drafter import ContextKV, DFlashDrafter
from dflash_sglang.core.engine import EngineConfig, ReferenceEngine, autoregressive_generate
from dflash_sglang.core.predraft import OutcomeGuess, PreDrafts, predraft_block
from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
from dflash_sglang.core.sampling import SamplingConfig
from dflash_sglang.core.target import HFTarget

from .test_engine_sampling import chi2_pvalue, exact_law, marginal

SHIPPED = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash-b16"
EOS = (2,)
MASK = 0


def test_predraft_block_lays_out_known_tokens_then_masks() -> None:
    block = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])  # B = 4: first token, 3 drafts
    guess = OutcomeGuess(accept_len=torch.tensor([[0, 2], [1, 0]]), bonus=torch.tensor([[7, 8], [9, 5]]),
                         prob=torch.ones(2, 2))
    inp = predraft_block(block, torch.tensor([100, 50]), guess, MASK)
    L = 2 + 4 + 1  # max k + B + 1
    assert inp.tokens.shape == (4, L)
    assert inp.tokens.tolist() == [
        [10, 7, 0, 0, 0, 0, 0],  # k=0: first token, bonus, 3 masks, 2 padding
        [10, 11, 12, 8, 0, 0, 0],  # k=2: first token, 2 accepted drafts, bonus, 3 masks
        [20, 21, 9, 0, 0, 0, 0],
        [20, 5, 0, 0, 0, 0, 0],
    ]
    assert inp.valid.sum(1).tolist() == [5, 7, 6, 5]
    assert inp.positions[0].tolist() == list(range(100, 107)) and inp.positions[2, 0] == 50
    assert inp.draft_at.tolist() == [[2, 3, 4], [4, 5, 6], [3, 4, 5], [2, 3, 4]]


def test_padding_is_invisible_to_the_predraft() -> None:
    """A padded pre-draft row drafts exactly what its unpadded block alone drafts (block_valid masks
    the padding as keys)."""
    torch.manual_seed(0)
    tcfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2)
    d = random_drafter(drafter_config_for(tcfg, num_layers=2, block_size=4, mask_token_id=0), std=0.3)
    ctx_len, h = 6, d.cfg.hidden_size
    taps = torch.randn(1, ctx_len, d.cfg.num_taps * h)
    k, v = d.context_kv(taps, torch.arange(ctx_len)[None])
    ctx = ContextKV(k, v, torch.arange(ctx_len)[None], torch.ones(1, ctx_len, dtype=torch.bool))
    embed = torch.randn(50, h)
    short = torch.tensor([[3, 7, 0, 0, 0]])  # known 3, bonus 7, three masks
    want = d.forward_block(embed[short], ctx_len + torch.arange(5)[None], ctx)
    padded = torch.tensor([[3, 7, 0, 0, 0, 0, 0]])
    valid = torch.tensor([[True] * 5 + [False] * 2])
    got = d.forward_block(embed[padded], ctx_len + torch.arange(7)[None], ctx, valid)
    torch.testing.assert_close(got[:, :5], want, rtol=1e-5, atol=1e-5)


def test_match_finds_the_guess_equal_to_the_outcome() -> None:
    guess = OutcomeGuess(torch.tensor([[0, 1, 0], [2, 0, 1]]), torch.tensor([[5, 6, 7], [1, 2, 3]]),
                         torch.ones(2, 3))
    pre = PreDrafts(guess, torch.zeros(2, 3, 3, dtype=torch.long), torch.zeros(2, 3, 3, 4), None)
    assert pre.match(torch.tensor([0, 1]), torch.tensor([7, 2])).tolist() == [2, -1]


@pytest.fixture(scope="module")
def shipped_drafter() -> DFlashDrafter:
    return DFlashDrafter.from_pretrained(SHIPPED)


@pytest.mark.parametrize("where", ["inline", "thread", "cuda-stream"])
def test_greedy_with_predraft_is_the_targets_output(smollm2, spec_bench_ids, shipped_drafter, where) -> None:
    """The shipped drafter guesses verify's outcome often enough that some blocks are pre-drafts;
    output equals plain greedy decoding, with the pre-draft inline, on a second thread, or (CUDA only)
    on the drafter's side stream concurrently with the verify."""
    model, _ = smollm2
    drafter = shipped_drafter
    if where == "cuda-stream":
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA: the side-stream pre-draft")
        model, drafter = copy.deepcopy(model).cuda(), copy.deepcopy(drafter).cuda()
    target = HFTarget(model, drafter.cfg.target_layer_ids)
    prompts = spec_bench_ids[:3]
    sampling = SamplingConfig.uniform(3, device=target.device)
    want = autoregressive_generate(target, prompts, 40, EOS, sampling)
    eng = ReferenceEngine(target, drafter, EngineConfig(16, 40, EOS, predraft_fanout=8,
                                                        predraft_thread=where == "thread"))
    assert eng.predrafter is not None and eng.predrafter.where == where
    got = [r.output_ids for r in eng.generate(prompts, sampling)]
    assert got == want
    st = eng.predrafter.stats
    assert st.predrafted_steps > 0 and st.hit_rate(8) > 0.05, st.to_dict()


V, N, PROMPT = 10, 6000, [1, 2, 3]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sampling_with_predraft_keeps_the_target_law(device: str) -> None:
    """Tiny random target (10 tokens): pre-drafted blocks are drafted from, and verified against, their
    own q, so the law of 4 sampled tokens is the target's (chi-square against the enumerated law). On
    CUDA the pre-draft runs on the drafter's side stream, concurrently with the verify."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA: the side-stream pre-draft")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.4, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    drafter = random_drafter(drafter_config_for(cfg, num_layers=1, block_size=3, mask_token_id=0), std=0.4)
    eng = ReferenceEngine(HFTarget(copy.deepcopy(model).to(device), drafter.cfg.target_layer_ids),
                          drafter.to(device), EngineConfig(block_size=3, max_new_tokens=4, predraft_fanout=8))
    where = "cuda-stream" if device == "cuda" else "inline"
    assert eng.predrafter is not None and eng.predrafter.where == where
    sampling = SamplingConfig.uniform(N, 1.0, device=device)
    res = eng.generate([PROMPT] * N, sampling, torch.Generator(device).manual_seed(3))
    samples = [tuple(r.output_ids) for r in res]
    st = eng.predrafter.stats
    assert st.predrafted_steps > N // 4, st.to_dict()  # the reuse path really ran
    law = exact_law(model, SamplingConfig.uniform(N, 1.0), 4)
    for idx in [(1,), (2,), (3,), (1, 2), (2, 3)]:
        p = chi2_pvalue([tuple(s[i] for i in idx) for s in samples], marginal(law, idx))
        assert p > 1e-3, f"tokens {idx} deviate from the target law with pre-drafting (p={p:.2e})"
