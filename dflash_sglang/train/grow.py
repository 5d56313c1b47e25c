"""Growing a trained drafter: more draft layers without losing what it has learnt.

``grow_layers`` appends layers whose two residual writes (``self_attn.o_proj``, ``mlp.down_proj``) start
at zero, so at step 0 every new layer adds nothing to the residual stream and the grown drafter's
logits equal the old one's exactly. Training then opens them: the zero projections get gradients at
once (their inputs are random-initialised), and the rest of the new layer follows after the first step.
"""

from __future__ import annotations

import torch

from ..core.drafter import DFlashDrafter
from ..core.random_drafter import random_drafter

# the projections through which a draft layer writes into the residual stream
RESIDUAL_WRITES = ("self_attn.o_proj", "mlp.down_proj")


def grow_layers(drafter: DFlashDrafter, extra: int, seed: int = 0) -> DFlashDrafter:
    """A new drafter: ``drafter``'s weights and draft vocabulary, plus ``extra`` layers on top that
    start as the identity (see the module doc). ``drafter`` itself is left unchanged."""
    old = drafter.cfg.num_hidden_layers
    grown = random_drafter(drafter.cfg.with_extra_layers(extra), seed)
    state = grown.state_dict()
    with torch.no_grad():
        for name, t in drafter.state_dict().items():
            state[name].copy_(t)
        for i in range(old, old + extra):
            for proj in RESIDUAL_WRITES:
                state[f"layers.{i}.{proj}.weight"].zero_()
    grown.draft_vocab = drafter.draft_vocab
    return grown.to(next(drafter.parameters()).dtype).train(drafter.training)
