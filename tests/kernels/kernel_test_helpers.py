"""Small builders shared by the kernel tests."""

from __future__ import annotations

from typing import Any

import torch

from dflash_sglang.core.config import DFlashConfig
from dflash_sglang.core.drafter import DFlashDrafter


def tiny_drafter(dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> DFlashDrafter:
    """A 2-layer random DFlash drafter (hidden 32, 2 kv heads of dim 16) with non-trivial norms."""
    d: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "vocab_size": 64,
        "block_size": 4,
        "num_target_layers": 4,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 0},
    }
    d.update(overrides)
    torch.manual_seed(seed)
    model = DFlashDrafter(DFlashConfig.from_dict(d))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
