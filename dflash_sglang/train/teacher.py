"""The target's own next-token distribution at every training position, recomputed from the last tap.

Soft labels (``train --soft-labels``) need the target's logits at the positions whose next tokens the
drafter learns. The distill store keeps token ids and the tap features only, and the last tap is the
output of a layer near the top (SmolLM2: layer 27 of 30). Running the target's layers above it, its
final norm and its LM head over the stored tap reproduces the target's logits, at the cost of those few
layers per step (two of 30 for SmolLM2) instead of a second copy of the data or a full forward.

The taps are stored in bf16, so these logits carry that rounding (the test pins them to the target's
own fp32 logits within bf16 tolerance); the hard labels stay the stored greedy tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class TopLayersTeacher:
    """taps [S, L, T*H] -> the target's final-normed hidden states [S, L, H] (causal over each row)."""

    def __init__(self, model: nn.Module, tap_layer_ids: Sequence[int]) -> None:
        base = getattr(model, "model", None)
        needed = ("layers", "norm", "rotary_emb")
        if base is None or not all(hasattr(base, n) for n in needed):
            raise ValueError(f"{type(model).__name__}: soft labels need a Llama-shaped target "
                             f"(model.{{{', '.join(needed)}}})")
        last = max(tap_layer_ids)
        self.tap_index = list(tap_layer_ids).index(last)
        self.layers = list(base.layers)[last + 1:]
        self.norm, self.rotary = base.norm, base.rotary_emb
        self.hidden_size = int(model.config.hidden_size)

    @torch.no_grad()
    def __call__(self, taps: torch.Tensor) -> torch.Tensor:
        s, length, _ = taps.shape
        h = self.hidden_size
        dtype = self.norm.weight.dtype
        x = taps[..., self.tap_index * h: (self.tap_index + 1) * h].to(dtype)  # [S, L, H]
        pos = torch.arange(length, device=taps.device).expand(s, length)
        pe = self.rotary(x, pos)
        for layer in self.layers:  # attention_mask None: causal (right padding never reaches real rows)
            out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
            x = out[0] if isinstance(out, tuple) else out
        return self.norm(x)
