"""Adaptive block policy: expected tokens from acceptance, cost-aware choice, exploration."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.adaptive import AcceptanceTracker, BlockPolicy, CostModel


def test_acceptance_rates_are_conditional() -> None:
    t = AcceptanceTracker(max_block=4, decay=1.0)
    # accept lengths 0, 1, 3 with block 4: position 1 reached 3x accepted 2x; position 2 reached 2x
    # accepted 1x; position 3 reached 1x accepted 1x.
    t.update(torch.tensor([0, 1, 3]), block=4)
    assert t.rates().tolist() == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert t.expected_tokens(4) == pytest.approx(1 + 2 / 3 + (2 / 3) * (1 / 2) + (2 / 3) * (1 / 2) * 1.0)
    assert t.expected_tokens(1) == 1.0


def test_expected_tokens_match_empirical_mean() -> None:
    torch.manual_seed(0)
    a = torch.tensor([0.9, 0.8, 0.7, 0.5, 0.5, 0.4, 0.3])
    t = AcceptanceTracker(max_block=8, decay=1.0)
    steps = 20000
    draws = torch.rand(steps, 7) < a
    accept_len = torch.cumprod(draws.int(), 1).sum(1)
    t.update(accept_len, 8)
    assert t.expected_tokens(8) == pytest.approx(float((accept_len + 1).float().mean()), rel=0.01)


def test_cost_buckets() -> None:
    assert [CostModel.bucket(b) for b in (1, 2, 3, 4, 5, 16, 17)] == [1, 2, 4, 4, 8, 16, 32]


def simulate(policy: BlockPolicy, bs: int, accept: float, cost, steps: int) -> list[int]:
    """Drive the policy against a synthetic machine; returns the chosen blocks."""
    gen = torch.Generator().manual_seed(1)
    chosen = []
    for _ in range(steps):
        b = policy.choose(bs)
        draws = torch.rand(bs, max(b - 1, 0), generator=gen) < accept
        acc = torch.cumprod(draws.int(), 1).sum(1) if b > 1 else torch.zeros(bs, dtype=torch.long)
        policy.record(bs, b, acc, cost(bs, b))
        chosen.append(b)
    return chosen


def test_speculates_when_acceptance_pays() -> None:
    # Memory-bound machine: a step costs about the same whatever the block.
    chosen = simulate(BlockPolicy(16), bs=1, accept=0.8, cost=lambda bs, b: 1.0 + 0.01 * b, steps=300)
    assert chosen[-50:].count(16) + chosen[-50:].count(8) >= 45


def test_stops_speculating_when_verify_is_compute_bound() -> None:
    # Compute-bound (large batch on a CPU): cost grows with bs*b, acceptance is poor.
    chosen = simulate(BlockPolicy(16), bs=16, accept=0.2, cost=lambda bs, b: 0.1 + 0.01 * bs * b, steps=300)
    assert chosen[-50:].count(1) >= 45


def test_every_candidate_is_measured_and_explored() -> None:
    p = BlockPolicy(16, warmup=2, explore_every=10)
    assert p.candidates == [1, 2, 4, 8, 16]
    chosen = simulate(p, bs=4, accept=0.6, cost=lambda bs, b: 1.0, steps=200)
    assert set(chosen[:10]) == {1, 2, 4, 8, 16}
    assert len(set(chosen[100:])) >= 2  # exploration keeps the runner-up measured


def test_compute_bound_batch_never_pays_for_a_large_block() -> None:
    # The ladder stops at the first losing rung: b = 2 loses to b = 1, so 4, 8, 16 are never run.
    p = BlockPolicy(16, explore_every=16)
    chosen = simulate(p, bs=16, accept=0.2, cost=lambda bs, b: 0.1 + 0.01 * bs * b, steps=200)
    assert max(chosen) == 2
    assert chosen.count(2) <= p.warmup + 200 // 16 + 1
    assert p.switches == [(p.warmup * 2 + 1, 16, 1)]
    assert p.summary()["16"]["chosen"] == 1


def test_climb_stops_at_the_peak_of_a_unimodal_machine() -> None:
    # Cost grows super-linearly past 16 tokens; acceptance 0.9 makes b = 8 the best rung.
    def cost(bs: int, b: int) -> float:
        return 1.0 + 0.02 * b + (0.5 * (b - 8) if b > 8 else 0.0)

    p = BlockPolicy(16, explore_every=1000)
    chosen = simulate(p, bs=1, accept=0.9, cost=cost, steps=100)
    assert chosen[-20:] == [8] * 20
    assert p.summary()["1"]["chosen"] == 8


def test_follows_a_drop_in_acceptance() -> None:
    p = BlockPolicy(16, explore_every=8)
    cost = lambda bs, b: 1.0 + 0.1 * b  # noqa: E731
    first = simulate(p, bs=1, accept=0.95, cost=cost, steps=150)
    assert first[-10:].count(16) + first[-10:].count(8) >= 9
    p.acceptance.decay = 0.8  # forget the good drafts quickly
    then = simulate(p, bs=1, accept=0.0, cost=cost, steps=150)
    assert then[-30:].count(1) >= 25
    assert p.switches[-1][2] == 1


def test_cost_is_a_running_mean_before_it_decays() -> None:
    c = CostModel(decay=0.9)
    for s in (10.0, 1.0, 1.0, 1.0):  # a cold first step, then the real cost
        c.update(1, 4, s)
    assert c.get(1, 4) == pytest.approx(13.0 / 4)
    for _ in range(200):
        c.update(1, 4, 2.0)
    assert c.get(1, 4) == pytest.approx(2.0, rel=1e-6)


def test_near_ties_do_not_flip_the_block() -> None:
    # Blocks 1 and 2 cost the same up to 1% noise and block 2 accepts nothing: a tie. Without the
    # margin the exploited block follows the noise; with it, it stays put.
    import random

    def flips(margin: float) -> int:
        rng = random.Random(0)
        p = BlockPolicy(2, explore_every=4, margin=margin)
        simulate(p, bs=4, accept=0.0, cost=lambda bs, b: 1.0 + 0.01 * rng.random(), steps=400)
        return len(p.switches)

    assert flips(0.0) > 5  # the control: noise alone flips it
    assert flips(0.03) == 1
