"""Per-request sampling parameters and logits -> probabilities conversion (pure PyTorch).

Conventions:
  * ``temperature == 0`` marks a greedy request; its probabilities are a one-hot on the argmax of the
    raw logits (ties resolve to the lowest token id, like ``torch.argmax``).
  * ``top_k <= 0`` or ``top_k >= V`` disables top-k; ``top_p >= 1`` disables top-p; ``min_p <= 0``
    disables min-p.
  * Filtering order is: temperature, then top-k, then top-p on the top-k-renormalised distribution,
    then min-p (drop tokens whose probability is below ``min_p`` times the most likely token's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters of a batch, one entry per request (all tensors on the same device)."""

    temperature: torch.Tensor  # [bs] float32, 0 -> greedy
    top_k: torch.Tensor  # [bs] int64, 0 or >= V -> off
    top_p: torch.Tensor  # [bs] float32, 1.0 -> off
    min_p: torch.Tensor | None = None  # [bs] float32, 0.0 -> off; None: off for every row
    # Host-side hints that spare a device read; None: computed from the tensors (one host read each).
    all_greedy: bool | None = None  # is every row greedy?
    any_filter: bool | None = None  # does any row filter by top-k / top-p / min-p?

    def __post_init__(self) -> None:
        bs = self.temperature.shape
        if self.temperature.dim() != 1 or self.top_k.shape != bs or self.top_p.shape != bs:
            raise ValueError("temperature, top_k and top_p must all have shape [bs]")
        if self.min_p is not None and self.min_p.shape != bs:
            raise ValueError("min_p must have shape [bs]")

    @classmethod
    def uniform(
        cls,
        bs: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        device: torch.device | str = "cpu",
    ) -> SamplingConfig:
        """The same parameters for every one of ``bs`` requests."""
        return cls(
            temperature=torch.full((bs,), temperature, dtype=torch.float32, device=device),
            top_k=torch.full((bs,), top_k, dtype=torch.int64, device=device),
            top_p=torch.full((bs,), top_p, dtype=torch.float32, device=device),
        )

    @property
    def bs(self) -> int:
        return int(self.temperature.shape[0])

    def select(self, rows: torch.Tensor) -> SamplingConfig:
        """The parameters of ``rows`` [n] (indices; repeats allowed). The host hints are dropped (a
        subset may be all greedy where the whole batch was not)."""
        return SamplingConfig(self.temperature[rows], self.top_k[rows], self.top_p[rows],
                              None if self.min_p is None else self.min_p[rows])

    @property
    def is_greedy(self) -> torch.Tensor:
        """[bs] bool: rows decoded by argmax."""
        return self.temperature == 0


def _filter_active(cfg: SamplingConfig, vocab: int) -> bool:
    """Host-side check so the expensive sort is skipped when no row filters (one small sync, unless the
    caller's hint answers it)."""
    if cfg.any_filter is not None:
        return cfg.any_filter
    k_on = (cfg.top_k > 0) & (cfg.top_k < vocab)
    p_on = cfg.top_p < 1.0
    if cfg.min_p is not None:
        p_on = p_on | (cfg.min_p > 0)
    return bool((k_on | p_on).any())


def _top_k_top_p_mask_sorted(sorted_logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Keep-mask in sorted (descending) order. sorted_logits: [bs, n, V]; returns bool [bs, n, V]."""
    vocab = sorted_logits.shape[-1]
    rank = torch.arange(vocab, device=sorted_logits.device)  # [V]
    k = torch.where((cfg.top_k <= 0) | (cfg.top_k >= vocab), vocab, cfg.top_k)  # [bs]
    keep = rank.view(1, 1, vocab) < k.view(-1, 1, 1)  # [bs, 1, V] broadcast over n
    keep = keep.expand_as(sorted_logits)
    # Top-p on the top-k-renormalised distribution: keep a token iff the mass strictly before it
    # (in descending order) is < top_p. That is the smallest prefix with cumulative mass >= top_p.
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)  # [bs, n, V]
    mass_before = torch.cumsum(probs, dim=-1) - probs  # [bs, n, V], exclusive prefix sum
    top_p = cfg.top_p.view(-1, 1, 1)
    keep_p = (mass_before < top_p) | (top_p >= 1.0)
    keep_p[..., 0] = True  # the most likely token always survives
    keep = keep & keep_p
    if cfg.min_p is not None:
        # min-p compares each token's probability with the most likely token's, before any
        # renormalisation (a ratio that top-k/top-p renormalisation leaves unchanged).
        full = torch.softmax(sorted_logits, dim=-1)  # [bs, n, V]
        keep = keep & (full >= full[..., :1] * cfg.min_p.view(-1, 1, 1))
    return keep


def _filtered_softmax(scaled: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """softmax with per-row top-k/top-p applied. scaled: [bs, n, V] float32 -> probs [bs, n, V]."""
    if not _filter_active(cfg, scaled.shape[-1]):
        return torch.softmax(scaled, dim=-1)
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)  # [bs, n, V] each
    keep_sorted = _top_k_top_p_mask_sorted(sorted_logits, cfg)  # [bs, n, V]
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # back to vocab order
    # softmax over the kept set is exactly the renormalised filtered distribution.
    return torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Sampling distribution per row. logits: [bs, n, V] or [bs, V] -> float32 probs of the same shape.

    Greedy rows (temperature 0) become a one-hot on the argmax of the raw logits; every other row is
    softmax(logits / T) restricted to its top-k / top-p set and renormalised (each row sums to 1).
    """
    squeeze = logits.dim() == 2
    x = logits.unsqueeze(1) if squeeze else logits  # [bs, n, V]
    if x.dim() != 3 or x.shape[0] != cfg.bs:
        raise ValueError(f"logits must be [bs, n, V] or [bs, V] with bs={cfg.bs}, got {tuple(logits.shape)}")
    x = x.float()
    greedy = cfg.is_greedy.view(-1, 1, 1)  # [bs, 1, 1]
    temp = torch.where(greedy, 1.0, cfg.temperature.view(-1, 1, 1).float())  # avoid division by 0
    probs = _filtered_softmax(x / temp, cfg)  # [bs, n, V]
    one_hot = torch.zeros_like(probs).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
    probs = torch.where(greedy, one_hot, probs)
    return probs.squeeze(1) if squeeze else probs


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row. probs: [..., V] non-negative with positive row sums -> int64 [...].

    Zero-probability tokens are never drawn. Reproducible given the generator state.
    """
    flat = probs.reshape(-1, probs.shape[-1])  # [rows, V]
    if flat.shape[0] == 0:
        return torch.empty(probs.shape[:-1], dtype=torch.int64, device=probs.device)
    tokens = torch.multinomial(flat, num_samples=1, generator=generator)  # [rows, 1]
    return tokens.view(probs.shape[:-1])
