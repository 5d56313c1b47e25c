"""Build a small random DFlash drafter for any target (tests and smoke runs before training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .config import DFlashConfig, default_target_layer_ids
from .drafter import DFlashDrafter


def drafter_config_for(target_cfg: Any, num_layers: int = 1, block_size: int = 16,
                       mask_token_id: int = 0, num_taps: int | None = None,
                       intermediate_size: int | None = None) -> DFlashConfig:
    """A Qwen3-style drafter config shaped like ``target_cfg`` (an HF config)."""
    t = getattr(target_cfg, "text_config", None) or target_cfg
    heads = int(t.num_attention_heads)
    head_dim = int(getattr(t, "head_dim", None) or t.hidden_size // heads)
    rope = getattr(t, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(t, "rope_theta", 10000.0)))
    layers = int(t.num_hidden_layers)
    taps = default_target_layer_ids(layers, num_taps or min(5, max(1, layers // 4)))
    return DFlashConfig.from_dict({
        "architectures": ["DFlashDraftModel"],
        "hidden_size": int(t.hidden_size),
        "intermediate_size": int(intermediate_size or t.intermediate_size),
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(t, "num_key_value_heads", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(getattr(t, "rms_norm_eps", 1e-6)),
        "rope_theta": theta,
        "max_position_embeddings": int(getattr(t, "max_position_embeddings", 8192)),
        "vocab_size": int(t.vocab_size),
        "block_size": block_size,
        "num_target_layers": layers,
        "dflash_config": {"target_layer_ids": list(taps), "mask_token_id": mask_token_id},
    })


def random_drafter(cfg: DFlashConfig, seed: int = 0, std: float = 0.02) -> DFlashDrafter:
    torch.manual_seed(seed)
    model = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "_norm." in name or name.startswith(("norm.", "hidden_norm.")):
                p.fill_(1.0)
            elif p.dim() == 2:
                p.normal_(0.0, std)
            else:
                p.zero_()
    return model.eval()


def build_random_drafter(target_path: str | Path, out: str | Path, num_layers: int = 1,
                         block_size: int = 16, mask_token_id: int | None = None, seed: int = 0) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    tcfg = AutoConfig.from_pretrained(str(target_path))
    if mask_token_id is None:
        tok = AutoTokenizer.from_pretrained(str(target_path))
        mask_token_id = int(tok.unk_token_id if tok.unk_token_id is not None else tok.eos_token_id)
    cfg = drafter_config_for(tcfg, num_layers, block_size, mask_token_id)
    random_drafter(cfg, seed).save_pretrained(out)
    return Path(out)
