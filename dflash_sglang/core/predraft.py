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

from dataclasses import dataclass, field

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


# ------------------------------------------------------------------- part 2: the pre-draft itself
@dataclass(frozen=True)
class PreDraftBlock:
    """The drafter's input for the F pre-drafts of block n+1, one row per (request, guess): row
    r * F + f is guess f of request r. Without target features for block n, its predicted-accepted
    drafts and the bonus guess enter the block as known tokens (embeddings instead of masks); the
    context stays the injected KV up to block n's start."""

    tokens: torch.Tensor  # [bs*F, L] block n's first token, its k guessed-accepted drafts, the bonus
    # guess, then B-1 masks; right-padded to L = max(k) + B + 1
    positions: torch.Tensor  # [bs*F, L] absolute positions from block n's start
    valid: torch.Tensor  # [bs*F, L] bool; False = padding
    draft_at: torch.Tensor  # [bs*F, B-1] indices into L of block n+1's draft positions


def predraft_block(block: torch.Tensor, start: torch.Tensor, guess: OutcomeGuess,
                   mask_id: int) -> PreDraftBlock:
    """block [bs, B] block n (first token, drafts); start [bs] the position of block[:, 0]."""
    bs, nb = block.shape
    f = guess.accept_len.shape[1]
    k = guess.accept_len.reshape(-1, 1)  # [bs*F, 1]
    bonus = guess.bonus.reshape(-1, 1)
    length = int(k.max()) + nb + 1
    j = torch.arange(length, device=block.device)[None]  # [1, L]
    rows = block.repeat_interleave(f, dim=0)  # [bs*F, B]
    known = rows.gather(1, j.clamp_max(nb - 1).expand(rows.shape[0], -1))
    tokens = torch.where(j <= k, known, torch.where(j == k + 1, bonus, mask_id))
    valid = j < k + nb + 1
    tokens = tokens.masked_fill(~valid, mask_id)
    positions = start.repeat_interleave(f)[:, None] + j
    draft_at = k + 2 + torch.arange(nb - 1, device=block.device)[None]
    return PreDraftBlock(tokens, positions, valid, draft_at)


@dataclass(frozen=True)
class PreDrafts:
    """Block n+1's drafts for each guess of verify(n)'s outcome, ready to be used on a hit."""

    guess: OutcomeGuess  # [bs, F]
    tokens: torch.Tensor  # [bs, F, B-1] draft token ids
    logits: torch.Tensor  # [bs, F, B-1, V'] drafter logits over the draft head's rows
    rows_q: torch.Tensor | None  # [bs, F, B-1, V'] the draft distribution (None: argmax drafts)

    def select(self, rows: torch.Tensor) -> PreDrafts:
        g = self.guess
        return PreDrafts(OutcomeGuess(g.accept_len[rows], g.bonus[rows], g.prob[rows]), self.tokens[rows],
                         self.logits[rows], None if self.rows_q is None else self.rows_q[rows])

    def match(self, accept_len: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
        """[bs] index of the guess equal to the real outcome, -1 where none is."""
        exact = (self.guess.accept_len == accept_len[:, None]) & (self.guess.bonus == bonus[:, None])
        return torch.where(exact.any(1), exact.long().argmax(1), -1)


@dataclass
class PreDraftStats:
    """Per request-step counts of one engine's pre-drafting (summed over generate() calls)."""

    fanout: int
    steps: int = 0  # request-steps that were verified with a drafted block
    hit_rank: list[int] = field(default_factory=list)  # [F]: steps whose outcome was guess f
    predrafted_steps: int = 0  # steps whose block was a pre-draft (the previous step hit)
    predrafted_committed: int = 0  # tokens those steps committed
    normal_committed: int = 0  # tokens the other steps committed

    def __post_init__(self) -> None:
        if not self.hit_rank:
            self.hit_rank = [0] * self.fanout

    def hit_rate(self, f: int) -> float:
        """Share of steps whose outcome was among the first f guesses."""
        return sum(self.hit_rank[:f]) / max(1, self.steps)

    def to_dict(self) -> dict:
        normal = self.steps - self.predrafted_steps
        return {"fanout": self.fanout, "steps": self.steps,
                "hit_rate": {f"F={f}": round(self.hit_rate(f), 4) for f in (1, 2, 4, 8) if f <= self.fanout},
                "predrafted_steps": self.predrafted_steps,
                "tau_predrafted": self.predrafted_committed / max(1, self.predrafted_steps),
                "tau_normal": self.normal_committed / max(1, normal)}
