"""An HF transformers causal LM seen as a DFlash target: logits plus tap-layer hidden states.

Tap layer i means the OUTPUT of decoder layer i (HF ``hidden_states[i + 1]``), captured with forward
hooks so no other layer's states are kept. The drafter borrows ``embed`` and ``lm_head_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .config import TargetSpec


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor  # [bs, n, V] float32
    taps: torch.Tensor  # [bs, n, T*H] tap-layer outputs, concatenated in tap order


class HFTarget:
    def __init__(self, model: nn.Module, tap_layer_ids: tuple[int, ...]) -> None:
        self.model = model.eval()
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.spec = TargetSpec.from_hf_config(model.config)
        layers = _decoder_layers(model)
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [layers[i].register_forward_hook(self._capture(i)) for i in set(self.tap_layer_ids)]

    def _capture(self, i: int):
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
            self._captured[i] = out[0] if isinstance(out, tuple) else out

        return hook

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.embed_weight)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [bs, n]
        position_ids: torch.Tensor,  # [bs, n]
        attention_mask: torch.Tensor,  # [bs, cached + n] 1 = visible key
        cache: Any,
    ) -> TargetOutput:
        self._captured.clear()
        out = self.model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
            past_key_values=cache, use_cache=True,
        )
        taps = torch.cat([self._captured[i] for i in self.tap_layer_ids], dim=-1)
        return TargetOutput(out.logits.float(), taps)


def left_pad(prompts: list[list[int]], device: torch.device | str
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A left-padded batch: the last column holds every prompt's last token.

    -> ids [bs, P] (0 in padding), valid [bs, P] (bool), positions [bs, P] (0 in padding)."""
    bs, plen = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(bs, plen, dtype=torch.long, device=device)
    valid = torch.zeros(bs, plen, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, plen - len(p):] = torch.tensor(p, device=device)
        valid[i, plen - len(p):] = True
    return ids, valid, (valid.long().cumsum(1) - 1).clamp_min(0)


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    base = getattr(model, "model", model)
    base = getattr(base, "language_model", base)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers (expected model.layers)")
    return layers


def load_hf_target(
    path: str, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path)
