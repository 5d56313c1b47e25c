"""core.predraft: outcome prediction for pre-drafting (probabilities, calibration, hit counting)."""

from __future__ import annotations

import torch

from dflash_sglang.core.predraft import (
    Calibration,
    DraftBelief,
    OutcomeGuess,
    accept_len_probs,
    hits,
    predict_outcomes,
)


def test_accept_len_probs_is_the_stopping_distribution() -> None:
    a = torch.tensor([[0.5, 0.2, 0.9]])
    want = torch.tensor([[0.5, 0.5 * 0.8, 0.5 * 0.2 * 0.1, 0.5 * 0.2 * 0.9]])
    torch.testing.assert_close(accept_len_probs(a), want)
    torch.testing.assert_close(accept_len_probs(torch.rand(7, 15)).sum(1), torch.ones(7))


def test_calibration_recovers_a_skewed_acceptance_curve() -> None:
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(20000, generator=g)
    accepted = torch.rand(20000, generator=g) < conf ** 2  # overconfident drafter
    cal = Calibration.fit(conf, accepted, bins=20)
    probe = torch.tensor([0.1, 0.5, 0.9])
    assert (cal(probe) - probe ** 2).abs().max() < 0.06, cal(probe)
    assert (Calibration.identity()(probe) - probe).abs().max() < 0.051


def _belief(bs: int, n: int, vocab: int, g: torch.Generator) -> tuple[DraftBelief, torch.Tensor]:
    probs = torch.softmax(3 * torch.randn(bs, n, vocab, generator=g), -1)
    return DraftBelief.from_probs(probs, probs.argmax(-1), alternatives=3), probs


def test_guesses_are_ranked_and_name_an_alternative_at_the_stop_position() -> None:
    g = torch.Generator().manual_seed(1)
    belief, probs = _belief(4, 6, 12, g)
    guess = predict_outcomes(belief, Calibration.identity(), fanout=5)
    assert guess.prob.shape == (4, 5)
    assert bool((guess.prob[:, :-1] >= guess.prob[:, 1:]).all())
    for r in range(4):
        for f in range(5):
            k, b = int(guess.accept_len[r, f]), int(guess.bonus[r, f])
            assert b != int(belief.tokens[r, k])  # the bonus replaces a rejected draft
            assert b in belief.alternatives[r, k].tolist()


def test_hit_rate_matches_the_predicted_mass_when_the_model_is_right() -> None:
    """Outcomes drawn from the drafter's own beliefs (acceptance = confidence, the target's token at
    the stop position drawn from q among the non-drafted tokens): the hit rate at F equals the summed
    predicted probability of the F guesses (statistically)."""
    g = torch.Generator().manual_seed(2)
    bs, n, vocab = 4000, 5, 8
    belief, probs = _belief(bs, n, vocab, g)
    accepted = torch.rand(bs, n, generator=g) < belief.confidence
    k = (accepted.long().cumprod(1)).sum(1)  # [bs]
    rest = probs.scatter(-1, belief.tokens[..., None], 0.0)
    stop = k.clamp_max(n - 1)
    bonus = torch.multinomial(rest[torch.arange(bs), stop], 1, generator=g)[:, 0]
    bonus = torch.where(k == n, -1, bonus)  # every draft accepted: a bonus the drafter never scored
    guess = predict_outcomes(belief, Calibration.identity(bins=1000), fanout=4)
    got = hits(guess, k, bonus).float().mean(0)  # [F]
    expected = guess.prob.cumsum(1).mean(0)
    assert (got - expected).abs().max() < 0.03, (got, expected)
    wrong = predict_outcomes(belief, Calibration.identity(bins=1000), fanout=4)  # negative control:
    shuffled = hits(wrong, k.roll(1), bonus.roll(1)).float().mean(0)  # outcomes of other requests
    assert (shuffled - expected).abs().max() > 0.05


def test_hits_counts_a_match_at_or_above_rank() -> None:
    guess = OutcomeGuess(torch.tensor([[0, 1, 0]]), torch.tensor([[5, 6, 7]]), torch.ones(1, 3))
    assert hits(guess, torch.tensor([1]), torch.tensor([6])).tolist() == [[False, True, True]]
    assert hits(guess, torch.tensor([2]), torch.tensor([6])).tolist() == [[False, False, False]]
