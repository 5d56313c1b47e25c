"""Predicting a verify step's outcome from the drafter alone (issue #20, part 1: prediction).

Pre-drafting block n+1 while block n is verified needs a guess of verify(n)'s outcome: the accept
length k (0 .. B-1) and the bonus token, which is the target's token at block position k + 1. From the
drafter's own distribution at each block position:

  * a_i = P(draft i accepted | drafts before it accepted) = calibrate(q_i(d_i)), with ``Calibration``
    fitted on measured (confidence, accepted) pairs (raw drafter confidence is overconfident or
    underconfident depending on the drafter);
  * P(k) = a_1 ... a_k (1 - a_{k+1}) for k < B-1, and a_1 ... a_{B-1} for k = B-1;
  * for k < B-1 the target rejected d_{k+1}, so the bonus is one of the drafter's other candidates at
    position k+1: P(c | k) = q_{k+1}(c) / (1 - q_{k+1}(d_{k+1})) for its next-best tokens c;
  * k = B-1 (every draft accepted) has a bonus the drafter never scored: it is left out.

:func:`predict_outcomes` returns the F most likely (k, bonus) pairs per request. Only verify decides
what is committed, so a wrong prediction costs a wasted pre-draft, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftBelief:
    """What the drafter believed about its block (greedy drafts: d_i is the top candidate)."""

    tokens: torch.Tensor  # [bs, B-1] drafts d_1 .. d_{B-1}
    confidence: torch.Tensor  # [bs, B-1] q_i(d_i)
    alternatives: torch.Tensor  # [bs, B-1, A] the next-best tokens at each position, best first
    alt_probs: torch.Tensor  # [bs, B-1, A] their q_i

    @classmethod
    def from_probs(cls, probs: torch.Tensor, tokens: torch.Tensor, alternatives: int = 2) -> DraftBelief:
        """probs [bs, B-1, V] the drafter's distribution, tokens [bs, B-1] its drafts."""
        conf = probs.gather(-1, tokens[..., None])[..., 0]
        rest = probs.scatter(-1, tokens[..., None], 0.0)
        alt_p, alt = rest.topk(alternatives, dim=-1)
        return cls(tokens, conf, alt, alt_p)


@dataclass(frozen=True)
class Calibration:
    """Piecewise-constant map from drafter confidence to acceptance probability (equal-count bins)."""

    edges: torch.Tensor  # [n_bins - 1] confidence bin edges, increasing
    rates: torch.Tensor  # [n_bins] measured acceptance rate per bin

    @classmethod
    def identity(cls, bins: int = 10) -> Calibration:
        """Trust the drafter: a_i = q_i(d_i), up to the bin width (bin centres)."""
        return cls(torch.linspace(0, 1, bins + 1)[1:-1], (torch.arange(bins) + 0.5) / bins)

    @classmethod
    def fit(cls, confidence: torch.Tensor, accepted: torch.Tensor, bins: int = 10) -> Calibration:
        """confidence [n], accepted [n] bool: drafts that were verified (their predecessors accepted)."""
        if confidence.numel() < bins:
            raise ValueError(f"{confidence.numel()} samples cannot fill {bins} calibration bins")
        c, a = confidence.flatten().float(), accepted.flatten().float()
        order = c.argsort()
        chunks = torch.tensor_split(order, bins)
        edges = torch.stack([c[ch[-1]] for ch in chunks[:-1]])
        rates = torch.stack([a[ch].mean() for ch in chunks]).clamp(1e-4, 1 - 1e-4)
        return cls(edges, rates)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        idx = torch.bucketize(confidence.float(), self.edges.to(confidence.device))
        return self.rates.to(confidence.device)[idx]


@dataclass(frozen=True)
class OutcomeGuess:
    accept_len: torch.Tensor  # [bs, F] predicted k
    bonus: torch.Tensor  # [bs, F] predicted bonus token
    prob: torch.Tensor  # [bs, F] predicted probability of exactly this (k, bonus), descending


def accept_len_probs(accept: torch.Tensor) -> torch.Tensor:
    """a [bs, B-1] conditional acceptance -> P(k) [bs, B] for k = 0 .. B-1 (rows sum to 1)."""
    ones = torch.ones_like(accept[:, :1])
    survive = torch.cumprod(torch.cat([ones, accept], dim=1), dim=1)  # [bs, B]: P(k >= j)
    stop = torch.cat([1 - accept, ones], dim=1)  # [bs, B]: P(stop at j | reached j)
    return survive * stop


def predict_outcomes(belief: DraftBelief, calib: Calibration, fanout: int) -> OutcomeGuess:
    """The ``fanout`` most likely (accept length, bonus) pairs per request."""
    bs, n = belief.tokens.shape
    p_k = accept_len_probs(calib(belief.confidence))[:, :n]  # [bs, B-1]: k = 0 .. B-2 (bonus scored)
    cond = belief.alt_probs / (1 - belief.confidence).clamp_min(1e-6)[..., None]  # [bs, B-1, A]
    joint = (p_k[..., None] * cond).flatten(1)  # [bs, (B-1) * A]; entry k * A + j
    f = min(fanout, joint.shape[1])
    prob, idx = joint.topk(f, dim=1)
    a = belief.alternatives.shape[-1]
    k = idx // a
    bonus = belief.alternatives.flatten(1).gather(1, idx)
    return OutcomeGuess(k, bonus, prob)


def hits(guess: OutcomeGuess, accept_len: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """[bs, F] bool: guess f (or one ranked above it) equals the real outcome, i.e. hit rate at F."""
    exact = (guess.accept_len == accept_len[:, None]) & (guess.bonus == bonus[:, None])
    return exact.cumsum(1) > 0
