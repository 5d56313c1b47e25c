"""Sampling through the whole engine keeps the target's distribution (tiny random target, exact law)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dflash_sglang.core.engine import EngineConfig, ReferenceEngine, autoregressive_generate
from dflash_sglang.core.lookup import LookupConfig
from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
from dflash_sglang.core.sampling import SamplingConfig, probs_from_logits
from dflash_sglang.core.target import HFTarget

V, N, PROMPT = 10, 6000, [1, 2, 3]


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.4,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    drafter = random_drafter(drafter_config_for(cfg, num_layers=1, block_size=4, mask_token_id=0), std=0.4)
    return model, drafter


def exact_law(model, sampling: SamplingConfig, n: int) -> dict[tuple[int, ...], float]:
    """P(t1..tn | PROMPT) by enumerating every prefix (V**n sequences)."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        prefixes = list(law)
        ids = torch.tensor([PROMPT + list(p) for p in prefixes])
        with torch.no_grad():
            logits = model(ids).logits[:, -1]
        one = SamplingConfig(
            *(x[:1].expand(len(prefixes)) for x in (sampling.temperature, sampling.top_k, sampling.top_p))
        )
        probs = probs_from_logits(logits, one).double().numpy()
        law = {p + (t,): law[p] * probs[i, t] for i, p in enumerate(prefixes) for t in range(V)}
    return law


def chi2_pvalue(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float]) -> float:
    keys = sorted(law)
    exp = np.array([law[k] for k in keys])
    exp = exp / exp.sum() * len(samples)  # float32 softmax sums to 1 only within ~1e-7
    counts = dict.fromkeys(keys, 0)
    for s in samples:
        counts[s] += 1
    obs = np.array([counts[k] for k in keys], dtype=float)
    small = exp < 5  # pool rare cells so the chi-square approximation holds
    obs = np.append(obs[~small], obs[small].sum())
    exp = np.append(exp[~small], exp[small].sum())
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep]).pvalue)


def marginal(law, idx: tuple[int, ...]):
    out: dict[tuple[int, ...], float] = {}
    for k, p in law.items():
        key = tuple(k[i] for i in idx)
        out[key] = out.get(key, 0.0) + p
    return out


def run_engine(tiny, mode: str, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
               draft_vocab: list[int] | None = None, lookup: LookupConfig | None = None):
    model, drafter = tiny
    drafter.draft_vocab = None if draft_vocab is None else torch.tensor(draft_vocab)
    eng = ReferenceEngine(
        HFTarget(model, drafter.cfg.target_layer_ids),
        drafter,
        EngineConfig(block_size=4, max_new_tokens=3, sampling_mode=mode, lookup=lookup),
    )
    sampling = SamplingConfig.uniform(N, temperature, top_k, top_p)
    res = eng.generate([PROMPT] * N, sampling, torch.Generator().manual_seed(seed))
    drafter.draft_vocab = None
    return [tuple(r.output_ids) for r in res], sampling, res, eng


@pytest.mark.parametrize(
    "mode,temperature,top_k,top_p",
    [
        ("rejection", 1.0, 0, 1.0),
        ("rejection", 0.7, 5, 0.9),
        ("target_only", 0.7, 0, 1.0),
    ],
)
def test_engine_sampling_matches_target_law(tiny, mode, temperature, top_k, top_p):
    samples, sampling, res, _ = run_engine(tiny, mode, temperature, top_k, top_p)
    assert all(len(s) == 3 for s in samples)
    assert max(k for r in res for k in r.committed_per_step) > 1  # drafts were accepted sometimes
    law = exact_law(tiny[0], sampling, 3)
    for idx in [(1,), (2,), (0, 1), (1, 2)]:
        sub = [tuple(s[i] for i in idx) for s in samples]
        p = chi2_pvalue(sub, marginal(law, idx))
        assert p > 1e-3, f"{mode}: tokens {idx} deviate from the target law (p={p:.2e})"


def test_draft_vocabulary_subset_keeps_the_target_law(tiny):
    """Drafts only from 4 of the 10 tokens (q = 0 elsewhere): the output law is still the target's."""
    samples, sampling, res, _ = run_engine(tiny, "rejection", 1.0, draft_vocab=[1, 3, 4, 7], seed=5)
    assert max(k for r in res for k in r.committed_per_step) > 1
    law = exact_law(tiny[0], sampling, 3)
    for idx in [(1,), (2,), (0, 1), (1, 2)]:
        p = chi2_pvalue([tuple(s[i] for i in idx) for s in samples], marginal(law, idx))
        assert p > 1e-3, f"draft subset: tokens {idx} deviate from the target law (p={p:.2e})"


@pytest.mark.parametrize("mode", ["rejection", "target_only"])
def test_lookup_drafts_keep_the_target_law(tiny, mode):
    """With 10 tokens a step often finds its last token earlier in the text (about a fifth of the rows
    after the prompt [1, 2, 3]) and drafts by lookup (one-hot q); the output law is still exactly the
    target's."""
    samples, sampling, _, eng = run_engine(tiny, mode, 1.0, seed=11, lookup=LookupConfig(1, 4))
    st = eng.lookup_stats
    assert st.lookup_steps > 1000 and st.drafter_steps > 1000 and st.lookup_committed > st.lookup_steps
    law = exact_law(tiny[0], sampling, 3)
    for idx in [(1,), (2,), (0, 1), (1, 2)]:
        p = chi2_pvalue([tuple(s[i] for i in idx) for s in samples], marginal(law, idx))
        assert p > 1e-3, f"lookup ({mode}): tokens {idx} deviate from the target law (p={p:.2e})"


def test_plain_sampling_matches_target_law(tiny):
    """The baseline sampler and the exact-law helper agree (validates the test itself)."""
    model, drafter = tiny
    sampling = SamplingConfig.uniform(N, 1.0)
    out = autoregressive_generate(
        HFTarget(model, (1,)), [PROMPT] * N, 2, (), sampling, torch.Generator().manual_seed(1)
    )
    law = exact_law(model, sampling, 2)
    assert chi2_pvalue([tuple(o) for o in out], law) > 1e-3


def test_biased_engine_fails_the_check(tiny, monkeypatch):
    """Negative control: accepting every draft must be detected by the same statistics."""
    import dflash_sglang.core.engine as engine_mod
    from dflash_sglang.core.verify import VerifyResult

    def accept_all(block, logits, sampling, draft_probs, generator):
        bs, nb = block.shape
        bonus = torch.multinomial(probs_from_logits(logits[:, -1], sampling), 1, generator=generator)[:, 0]
        committed = torch.cat([block[:, 1:], bonus[:, None]], dim=1)
        full = torch.full((bs,), nb - 1)
        return VerifyResult(full, bonus, committed, full + 1)

    monkeypatch.setattr(engine_mod, "verify", accept_all)
    samples, sampling, _, _ = run_engine(tiny, "rejection", 1.0)
    law = exact_law(tiny[0], sampling, 3)
    pvals = [
        chi2_pvalue([tuple(s[i] for i in idx) for s in samples], marginal(law, idx))
        for idx in [(1,), (2,), (1, 2)]
    ]
    assert min(pvals) < 1e-6


def test_step_observer_sees_each_verify_and_changes_nothing(tiny) -> None:
    """The observer gets one StepRecord per verify step whose committed tokens rebuild the output (after
    the prefill's token), and
    the drafter logits it sees pick the block's drafts (greedy)."""
    from dflash_sglang.core.engine import StepRecord

    model, drafter = tiny
    target = HFTarget(model, drafter.cfg.target_layer_ids)
    cfg = EngineConfig(4, 12)
    seen: list[StepRecord] = []
    plain = ReferenceEngine(target, drafter, cfg).generate([PROMPT], SamplingConfig.uniform(1))[0]
    watched = ReferenceEngine(target, drafter, cfg, observer=seen.append).generate(
        [PROMPT], SamplingConfig.uniform(1))[0]
    assert watched.output_ids == plain.output_ids
    assert len(seen) == watched.steps
    rebuilt = [t for r in seen for t in r.result.committed[0, : int(r.result.num_committed[0])].tolist()]
    out = watched.output_ids  # its first token comes from the prefill, the rest from verify steps
    assert rebuilt[: len(out) - 1] == out[1:]
    for r in seen:
        assert r.draft_logits is not None and r.draft_logits.shape == (1, 3, V)
        assert torch.equal(r.draft_logits.argmax(-1), r.block[:, 1:])
