"""Adaptive block size: speculate only as far as it pays, per batch.

Throughput of a step with block b for a batch of bs requests is
    E[tokens | b] / cost(bs, b)
where E[tokens | b] = 1 + sum_{j=1}^{b-1} prod_{i<=j} a_i  (a_i: measured probability that draft
position i is accepted given positions < i were) and cost(bs, b) is the measured wall time of a
step. b = 1 is plain decoding (no draft pass). The policy picks the b with the best estimate,
measures the candidates as a ladder (costs must be measured, not guessed: see BlockPolicy), and
re-explores now and then so the estimates follow the load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AcceptanceTracker:
    """Exponentially decayed counts per draft position (1-based position j at index j-1)."""

    max_block: int
    decay: float = 0.98
    reached: torch.Tensor = field(init=False)  # [max_block-1] steps that got to position j
    accepted: torch.Tensor = field(init=False)  # [max_block-1] of those, accepted at j

    def __post_init__(self) -> None:
        self.reached = torch.zeros(max(self.max_block - 1, 0), dtype=torch.float64)
        self.accepted = torch.zeros_like(self.reached)

    def update(self, accept_len: torch.Tensor, block: int) -> None:
        """accept_len [bs]: accepted drafts per request in a step that used ``block``."""
        if block <= 1 or accept_len.numel() == 0:
            return
        acc = accept_len.detach().to("cpu", torch.float64)
        pos = torch.arange(1, block, dtype=torch.float64)  # [b-1]
        reached = (acc[:, None] >= pos - 1).sum(0)
        accepted = (acc[:, None] >= pos).sum(0)
        self.reached.mul_(self.decay)[: block - 1] += reached
        self.accepted.mul_(self.decay)[: block - 1] += accepted

    def rates(self) -> torch.Tensor:
        """[max_block-1] conditional acceptance per position (optimistic 0.5 where unseen)."""
        return torch.where(self.reached > 0, self.accepted / self.reached.clamp_min(1e-9),
                           torch.full_like(self.reached, 0.5))

    def expected_tokens(self, block: int) -> float:
        if block <= 1:
            return 1.0
        return float(1.0 + torch.cumprod(self.rates()[: block - 1], 0).sum())


@dataclass
class CostModel:
    """Mean step time per (batch-size bucket, block): the plain mean of the first samples, then
    decayed (weight ``decay`` on the past), so one cold first step cannot dominate a rung's cost."""

    decay: float = 0.9
    seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    samples: dict[tuple[int, int], int] = field(default_factory=dict)

    @staticmethod
    def bucket(bs: int) -> int:
        return 1 << max(bs - 1, 0).bit_length()  # 1, 2, 4, 8, 16, ...

    def update(self, bs: int, block: int, seconds: float) -> None:
        key = (self.bucket(bs), block)
        n = self.samples.get(key, 0) + 1
        keep = min(self.decay, (n - 1) / n)  # 0, 1/2, 2/3, ... (running mean) up to decay
        self.seconds[key] = keep * self.seconds.get(key, 0.0) + (1 - keep) * seconds
        self.samples[key] = n

    def get(self, bs: int, block: int) -> float | None:
        return self.seconds.get((self.bucket(bs), block))


@dataclass
class BlockPolicy:
    """Per batch-size bucket, climb the candidate ladder 1, 2, 4, ..., max_block while each rung beats
    the one below, then exploit the best measured rung and re-measure a neighbour now and then.

    Throughput is unimodal in b (expected tokens are concave in b, step cost grows with b), so the
    climb stops at the first rung that loses; a compute-bound batch pays for two cheap rungs (b = 1,
    2), not for a max-size block. ``switches`` records each change of the exploited block per bucket.
    """

    max_block: int
    warmup: int = 2  # measured steps per (bucket, rung) before its cost counts
    explore_every: int = 64  # then one step on a neighbour of the best rung per this many steps
    margin: float = 0.03  # switch the exploited rung only for a gain above this fraction
    acceptance: AcceptanceTracker = field(init=False)
    cost: CostModel = field(default_factory=CostModel)
    steps: int = 0
    chosen: dict[int, int] = field(default_factory=dict)  # bucket -> block exploited last
    switches: list[tuple[int, int, int]] = field(default_factory=list)  # (step, bucket, new block)

    def __post_init__(self) -> None:
        self.acceptance = AcceptanceTracker(self.max_block)

    @property
    def candidates(self) -> list[int]:
        sizes = {1, self.max_block}
        b = 2
        while b < self.max_block:
            sizes.add(b)
            b *= 2
        return sorted(sizes)

    def choose(self, bs: int) -> int:
        self.steps += 1
        bucket = CostModel.bucket(bs)
        climb = self._next_rung(bucket, bs)
        if climb is not None:
            return climb
        rungs = self._measured(bucket)
        best = max(rungs, key=lambda b: self.throughput(bs, b))
        current = self.chosen.get(bucket)
        if current in rungs and self.throughput(bs, best) < (1 + self.margin) * self.throughput(bs, current):
            best = current  # a near tie is not worth a switch
        if current != best:
            self.chosen[bucket] = best
            self.switches.append((self.steps, bucket, best))
        if self.steps % self.explore_every == 0:
            i = self.candidates.index(best)
            near = [self.candidates[j] for j in (i - 1, i + 1) if 0 <= j < len(self.candidates)]
            return max(near, key=lambda b: (b in rungs, self.throughput(bs, b)))
        return best

    def _measured(self, bucket: int) -> list[int]:
        return [b for b in self.candidates if self.cost.samples.get((bucket, b), 0) >= self.warmup]

    def _next_rung(self, bucket: int, bs: int) -> int | None:
        """The rung still being climbed in this bucket, or None once the climb has stopped."""
        prev = None
        for b in self.candidates:
            if self.cost.samples.get((bucket, b), 0) < self.warmup:
                return b
            if prev is not None and self.throughput(bs, b) < self.throughput(bs, prev):
                return None
            prev = b
        return None

    def throughput(self, bs: int, block: int) -> float:
        seconds = self.cost.get(bs, block)
        return 0.0 if not seconds else self.acceptance.expected_tokens(block) / seconds

    def record(self, bs: int, block: int, accept_len: torch.Tensor, seconds: float) -> None:
        self.acceptance.update(accept_len, block)
        self.cost.update(bs, block, seconds)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per bucket: the exploited block and every measured rung's tokens/s estimate."""
        out: dict[str, dict[str, float]] = {}
        for (bucket, b), _ in sorted(self.cost.seconds.items()):
            out.setdefault(str(bucket), {})[str(b)] = round(self.throughput(bucket, b), 3)
        for bucket, b in self.chosen.items():
            out.setdefault(str(bucket), {})["chosen"] = b
        return out
