"""The DFlash drafter as an SGLang model class (architecture name ``DFlashDraftModel``).

All weights and math are the core ``DFlashDrafter``; this class only routes attention through
SGLang's ``RadixAttention`` so the drafter's KV lives in SGLang's paged draft KV pool, at the
same slot ids as the target's KV (one shared allocator): a radix-cache hit reuses both.

Under tensor parallelism the drafter's weights are replicated on every rank (2 layers, ~9M parameters
against the target's 135M: sharding them would add an all-reduce per layer to save little), while its
K/V cache is head-sharded like the target's: SGLang sizes every rank's draft pool for
``heads / tp`` KV heads (after padding the head counts on the CPU). Each rank attends with its own
heads and the outputs are all-gathered before the replicated o_proj (``HeadShard``).

Two entry points:
  forward()          a block of B tokens per request (TARGET_VERIFY forward mode on the draft
                     runner): queries from the block, keys/values = [context slots ; block],
                     non-causal (ENCODER_ONLY) on full-attention layers.
  inject_context()   projects committed tokens' tapped target states into every layer's K/V and
                     writes them at those tokens' slots (no attention, no forward pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.config import DFlashConfig, DFlashConfigError
from ..core.drafter import DFlashDrafter

# Head counts SGLang's CPU loader may raise so that tensor parallelism divides them
# (configs/update_config.adjust_config_with_unaligned_cpu_tp), with the drafter's own counts kept
# under ``original_*``.
_ORIGINALS = {"num_attention_heads": "original_num_attention_heads",
              "num_key_value_heads": "original_total_num_kv_heads",
              "intermediate_size": "original_intermediate_size"}


@dataclass(frozen=True)
class HeadShard:
    """This rank's drafter heads: the drafter's ``q_heads``/``kv_heads`` zero-padded to the pool's
    ``padded_q``/``padded_kv`` and split over ``tp`` ranks; rank ``rank`` attends with q heads
    [q0, q0 + local_q) and kv heads [kv0, kv0 + local_kv) (with fewer kv heads than ranks, each
    rank holds a copy of the one its q heads read)."""

    q_heads: int
    kv_heads: int
    padded_q: int
    padded_kv: int
    tp: int
    rank: int

    @classmethod
    def of(cls, cfg: DFlashConfig, hf_config: Any, tp: int, rank: int) -> HeadShard:
        padded_q = int(getattr(hf_config, "num_attention_heads", cfg.num_attention_heads))
        padded_kv = int(getattr(hf_config, "num_key_value_heads", cfg.num_key_value_heads))
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        if (padded_q < cfg.num_attention_heads or padded_kv < cfg.num_key_value_heads
                or padded_q != padded_kv * group or padded_q % tp
                or (padded_kv % tp and tp % padded_kv)):
            raise DFlashConfigError(
                f"the drafter's {cfg.num_attention_heads} query / {cfg.num_key_value_heads} KV heads "
                f"(pool: {padded_q} / {padded_kv}) cannot be split over tensor parallelism {tp}")
        return cls(cfg.num_attention_heads, cfg.num_key_value_heads, padded_q, padded_kv, tp, rank)

    @property
    def local_q(self) -> int:
        return self.padded_q // self.tp

    @property
    def local_kv(self) -> int:
        return max(1, self.padded_kv // self.tp)

    @property
    def q0(self) -> int:
        return self.rank * self.local_q

    @property
    def kv0(self) -> int:
        return self.q0 // (self.padded_q // self.padded_kv)  # the kv head of this rank's first q head

    def local(self, x: torch.Tensor, heads: int, first: int, count: int) -> torch.Tensor:
        """[..., heads, d] -> this rank's [..., count, d], zero heads past the drafter's own."""
        if self.tp == 1:
            return x
        pad = first + count - heads
        if pad > 0:
            x = torch.cat([x, x.new_zeros(*x.shape[:-2], pad, x.shape[-1])], dim=-2)
        return x[..., first:first + count, :]

    def gather(self, o: torch.Tensor, all_gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """This rank's attention output [n, local_q, d] -> all ranks' [n, q_heads, d] (rank order)."""
        if self.tp == 1:
            return o
        n, _, d = o.shape
        return all_gather(o.reshape(n, -1)).view(n, self.padded_q, d)[:, : self.q_heads]


def drafter_config(config: Any) -> DFlashConfig:
    """The drafter's own config from SGLang's (possibly head-padded) hf config."""
    d = config.to_dict()
    for name, original in _ORIGINALS.items():
        if d.get(original) is not None:
            d[name] = d[original]
    return DFlashConfig.from_dict(d)


class DFlashDraftModel(nn.Module):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        from sglang.srt.layers.radix_attention import AttentionType, RadixAttention

        super().__init__()
        self.config = config
        self.cfg = drafter_config(config)
        self.drafter = DFlashDrafter(self.cfg)
        from .draft_vocab import tp_group

        tp = tp_group()  # None: no parallel state (a unit test), tensor parallelism 1
        self.shard = HeadShard.of(self.cfg, config, tp.world_size if tp else 1, tp.rank_in_group if tp else 0)
        self._all_gather = (lambda t: tp.all_gather(t.contiguous(), dim=-1)) if tp else (lambda t: t)
        self.attn = nn.ModuleList()
        for i, layer in enumerate(self.drafter.layers):
            a = layer.self_attn
            self.attn.append(RadixAttention(
                num_heads=self.shard.local_q, head_dim=a.head_dim, scaling=a.scale,
                num_kv_heads=self.shard.local_kv, layer_id=i, sliding_window_size=a.window or -1,
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

        sh = self.shard

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # RadixAttention over [context slots ; block] from the draft KV pool, this rank's heads
            q = sh.local(q, sh.q_heads, sh.q0, sh.local_q)
            k, v = (sh.local(t, sh.kv_heads, sh.kv0, sh.local_kv) for t in (k, v))
            o = self.attn[i](q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1), forward_batch)
            return sh.gather(o.view(n, sh.local_q, -1), self._all_gather)

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
        sh = self.shard
        ks, vs = self.drafter.context_kv(taps.to(self.drafter.fc.weight.dtype), positions)
        for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
            kb, vb = kv_pool.get_key_buffer(i), kv_pool.get_value_buffer(i)
            kb[slots] = sh.local(k, sh.kv_heads, sh.kv0, sh.local_kv).to(kb.dtype)
            vb[slots] = sh.local(v, sh.kv_heads, sh.kv0, sh.local_kv).to(vb.dtype)


EntryClass = [DFlashDraftModel]
