"""The DFlash drafter as an SGLang model class (architecture name ``DFlashDraftModel``).

All weights and math are the core ``DFlashDrafter``; this class only routes attention through
SGLang's ``RadixAttention`` so the drafter's KV lives in SGLang's paged draft KV pool, at the
same slot ids as the target's KV (one shared allocator): a radix-cache hit reuses both.

Two entry points:
  forward()          a block of B tokens per request (TARGET_VERIFY forward mode on the draft
                     runner): queries from the block, keys/values = [context slots ; block],
                     non-causal (ENCODER_ONLY) on full-attention layers.
  inject_context()   projects committed tokens' tapped target states into every layer's K/V and
                     writes them at those tokens' slots (no attention, no forward pass).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..core.config import DFlashConfig
from ..core.drafter import DFlashDrafter


class DFlashDraftModel(nn.Module):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        from sglang.srt.layers.radix_attention import AttentionType, RadixAttention

        super().__init__()
        self.config = config
        self.cfg = DFlashConfig.from_dict(config.to_dict())
        self.drafter = DFlashDrafter(self.cfg)
        self.attn = nn.ModuleList()
        for i, layer in enumerate(self.drafter.layers):
            a = layer.self_attn
            self.attn.append(RadixAttention(
                num_heads=a.heads, head_dim=a.head_dim, scaling=a.scale, num_kv_heads=a.kv_heads,
                layer_id=i, sliding_window_size=a.window or -1,
                attn_type=AttentionType.DECODER if a.causal else AttentionType.ENCODER_ONLY,
                prefix=f"{prefix}attn.{i}",
            ))

    # ----------------------------------------------------------------- SGLang model API
    def get_input_embeddings(self) -> None:
        return None  # borrowed from the target by the worker

    def forward(
        self,
        input_ids: torch.Tensor,  # [bs*B]
        positions: torch.Tensor,  # [bs*B]
        forward_batch: Any,
        input_embeds: torch.Tensor | None = None,  # [bs*B, H] target embeddings of the block
        **_: Any,
    ) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        if input_embeds is None:
            raise ValueError("DFlashDraftModel needs input_embeds (the target's embeddings of the block)")
        d = self.drafter
        n = input_embeds.shape[0]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            a = d.layers[i].self_attn  # RadixAttention: [context slots ; block] from the draft KV pool
            o = self.attn[i](q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1), forward_batch)
            return o.view(n, a.heads, a.head_dim)

        hidden = d.run_layers(input_embeds.to(d.fc.weight.dtype), positions, attend)
        return LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.drafter.load_published_state(dict(weights))

    # ------------------------------------------------------------------- context KV
    @torch.no_grad()
    def inject_context(
        self,
        taps: torch.Tensor,  # [N, T*H] tapped target states of committed tokens
        positions: torch.Tensor,  # [N]
        slots: torch.Tensor,  # [N] KV slot ids (the target's slots of those tokens)
        kv_pool: Any,  # the draft runner's token_to_kv_pool
    ) -> None:
        if slots.numel() == 0:
            return
        ks, vs = self.drafter.context_kv(taps.to(self.drafter.fc.weight.dtype), positions)
        for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
            kb, vb = kv_pool.get_key_buffer(i), kv_pool.get_value_buffer(i)
            kb[slots] = k.to(kb.dtype)
            vb[slots] = v.to(vb.dtype)


EntryClass = [DFlashDraftModel]
