"""Training the context projection ``fc`` in units where every tap feature has scale 1.

The target's tapped hidden states are far from isotropic. SmolLM2-135M's layers 14, 20 and 27 carry a
"massive activation" in dimension 507 with an RMS near 1,490 while the median dimension's RMS is 5-16
(measured on the distilled answers). Through a plain ``fc`` that one dimension dominates the context
vector after ``hidden_norm``, and under Adam (updates of about lr per weight, whatever the input's
scale) every step moves the output along it by ~lr x 1,490: the drafter then learns little more than a
bigram model (the shipped drafter's first-draft accuracy on held-out answers: 19.5%; a bigram
table from the training answers: 19.7%).

The fix changes nothing a checkpoint or a loader sees. During training ``fc.weight`` is parametrised
as ``W = W' * s`` (``s`` [T*H] = 1 / the per-dimension RMS of the training taps, a buffer), so the
optimiser works on ``W'``, whose inputs ``s * x`` all have unit scale; the published checkpoint holds
``W`` itself (:func:`published`), the same ``fc`` every loader expects.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..core.drafter import DFlashDrafter


class ScaledColumns(nn.Module):
    """Parametrisation W = W' * scale (scale broadcast over the input columns)."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale.float())

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * self.scale.to(w.dtype)

    def right_inverse(self, w: torch.Tensor) -> torch.Tensor:
        return w / self.scale.to(w.dtype)


def tap_scales(taps: Sequence[torch.Tensor], max_rows: int = 65536, floor: float = 1e-2) -> torch.Tensor:
    """1 / RMS of every tap-feature dimension over (up to ``max_rows`` rows of) ``taps`` [n, T*H] -> [T*H]."""
    rows, total = [], 0
    for t in taps:
        take = t[: max_rows - total].float()
        rows.append(take)
        total += take.shape[0]
        if total >= max_rows:
            break
    x = torch.cat(rows)
    return 1.0 / x.pow(2).mean(0).sqrt().clamp_min(floor)


def precondition(drafter: DFlashDrafter, scale: torch.Tensor) -> None:
    """Parametrise ``drafter.fc.weight`` as W' * scale; the drafter computes exactly what it did."""
    if parametrize.is_parametrized(drafter.fc, "weight"):
        raise ValueError("fc.weight is already preconditioned")
    scaled = ScaledColumns(scale.to(drafter.fc.weight.device))
    parametrize.register_parametrization(drafter.fc, "weight", scaled)


def is_preconditioned(drafter: DFlashDrafter) -> bool:
    return parametrize.is_parametrized(drafter.fc, "weight")


def published(drafter: DFlashDrafter) -> DFlashDrafter:
    """The drafter as it is saved and served: a new one holding the effective ``fc.weight`` as a plain
    weight (a parametrised module cannot be deep-copied)."""
    if not is_preconditioned(drafter):
        return drafter
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("fc.parametrizations.")}
    state["fc.weight"] = drafter.fc.weight.detach()
    out = DFlashDrafter(drafter.cfg).to(drafter.fc.weight.device)
    out.load_state_dict(state)
    out.draft_vocab = drafter.draft_vocab
    return out
