"""``dflash_torch``: a torch-native SGLang attention backend with speculative (TARGET_VERIFY) support.

Every forward mode is reduced to one shape: request ``b`` has ``prefix_len[b]`` cached tokens (slots
``req_to_token[req_pool_indices[b], :prefix_len[b]]``) followed by ``q_len[b]`` new tokens (slots
``out_cache_loc[q_start[b]:q_start[b] + q_len[b]]``) that are also the queries. Per forward the
backend builds padded index tensors once (:class:`PaddedBatch`); per layer it writes the new K/V,
gathers ``[B, L, Hk, D]`` keys/values from the pool, and runs one masked SDPA.

Masks (True = may attend), per request, query ``i`` at sequence index ``prefix_len + i``, key ``j``:
- causal (EXTEND, DECODE):        ``j <= prefix_len + i``
- non-causal (ENCODER_ONLY):      every valid ``j`` (cached prefix + the whole new block)
- TARGET_VERIFY with custom mask: ``spec_info.custom_mask`` row-major ``[q_len, prefix_len + q_len]``
  per request, concatenated over requests (the triton/flashinfer layout); without one: causal
- sliding window ``w`` (causal only): additionally ``pos(q) - pos(k) <= w`` (SGLang's window_left)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from torch.nn.functional import scaled_dot_product_attention

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

MaskKey = tuple[bool, int]  # (causal, sliding window; -1 = none)


@dataclass
class PaddedBatch:
    """Per-forward index tensors shared by all layers. B requests, Q = max q_len, L = max kv len."""

    q_index: torch.Tensor  # [B, Q] int64 row into the flat token dim (0 where padded)
    q_valid: torch.Tensor  # [B, Q] bool
    kv_slots: torch.Tensor  # [B, L] int64 KV-pool slot (0 where padded)
    kv_valid: torch.Tensor  # [B, L] bool
    q_seq_idx: torch.Tensor  # [B, Q] int64 sequence index of each query (prefix_len + i)
    q_pos: torch.Tensor  # [B, Q] int64 rope position of each query (for windows)
    k_pos: torch.Tensor  # [B, L] int64 rope position of each key (for windows)
    custom_mask: torch.Tensor | None  # [B, Q, L] bool, TARGET_VERIFY only
    masks: dict[MaskKey, torch.Tensor] = field(default_factory=dict)  # [B, 1, Q, L] bool cache


def build_padded_batch(
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: list[int],
    prefix_lens: list[int],
    q_lens: list[int],
    out_cache_loc: torch.Tensor,
    positions: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
) -> PaddedBatch:
    """Lay out B requests as padded [B, Q] queries and [B, L] keys (see module docstring)."""
    bs = len(q_lens)
    q_max = max(q_lens, default=0)
    kv_lens = [p + q for p, q in zip(prefix_lens, q_lens, strict=True)]
    l_max = max(kv_lens, default=0)
    dev = out_cache_loc.device
    q_index = torch.zeros(bs, q_max, dtype=torch.int64, device=dev)
    q_valid = torch.zeros(bs, q_max, dtype=torch.bool, device=dev)
    kv_slots = torch.zeros(bs, l_max, dtype=torch.int64, device=dev)
    kv_valid = torch.zeros(bs, l_max, dtype=torch.bool, device=dev)
    q_seq_idx = torch.zeros(bs, q_max, dtype=torch.int64, device=dev)
    k_pos = torch.arange(l_max, dtype=torch.int64, device=dev).expand(bs, l_max).clone()
    cmask = torch.zeros(bs, q_max, l_max, dtype=torch.bool, device=dev) if custom_mask is not None else None
    q_start, m_start = 0, 0
    for b, (req, p, n) in enumerate(zip(req_pool_indices, prefix_lens, q_lens, strict=True)):
        rows = torch.arange(q_start, q_start + n, dtype=torch.int64, device=dev)
        q_index[b, :n] = rows
        q_valid[b, :n] = True
        q_seq_idx[b, :n] = torch.arange(p, p + n, device=dev)
        kv_slots[b, :p] = req_to_token[req, :p].to(torch.int64)
        kv_slots[b, p : p + n] = out_cache_loc[q_start : q_start + n].to(torch.int64)
        kv_valid[b, : p + n] = True
        if positions is not None:
            k_pos[b, p : p + n] = positions[q_start : q_start + n]
        if cmask is not None:
            size = n * (p + n)
            cmask[b, :n, : p + n] = custom_mask[m_start : m_start + size].view(n, p + n).to(torch.bool)
            m_start += size
        q_start += n
    q_pos = torch.gather(k_pos, 1, q_seq_idx.clamp(max=max(l_max - 1, 0))) if l_max else q_seq_idx
    return PaddedBatch(q_index, q_valid, kv_slots, kv_valid, q_seq_idx, q_pos, k_pos, cmask)


def batch_mask(batch: PaddedBatch, *, causal: bool, window: int) -> torch.Tensor:
    """[B, 1, Q, L] bool mask for one (causal, window) kind; cached on the batch."""
    key = (causal, window)
    if key in batch.masks:
        return batch.masks[key]
    mask = batch.kv_valid[:, None, :].expand(-1, batch.q_index.shape[1], -1).clone()  # [B, Q, L]
    if batch.custom_mask is not None:
        mask &= batch.custom_mask
    elif causal:
        k_idx = torch.arange(mask.shape[2], device=mask.device)
        mask &= k_idx[None, None, :] <= batch.q_seq_idx[:, :, None]
    if causal and window >= 0:
        mask &= (batch.q_pos[:, :, None] - batch.k_pos[:, None, :]) <= window
    # Padded query rows attend to slot column 0 so that softmax stays finite; their output is dropped.
    mask[:, :, 0] |= ~batch.q_valid
    batch.masks[key] = mask[:, None]
    return batch.masks[key]


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, logit_cap: float
) -> torch.Tensor:
    """q [B, H, Q, D], k [B, Hk, L, D], v [B, Hk, L, Dv], mask [B, 1, Q, L] -> [B, H, Q, Dv].

    Grouped heads (H = rep x Hk, query head h reads KV head h // rep) fold the group into the query
    axis, [B, Hk, rep x Q, D], instead of copying K/V rep times: no per-layer [B, H, L, D] copies.
    """
    bsz, heads, q_len, _ = q.shape
    rep = heads // k.shape[1]
    if rep != 1:
        q = q.reshape(bsz, k.shape[1], rep * q_len, q.shape[-1])
        mask = mask.repeat(1, 1, rep, 1)  # [B, 1, rep x Q, L], row r x Q + i = query i
    if logit_cap <= 0:
        out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        scores = logit_cap * torch.tanh(scores / logit_cap)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)
    return out.reshape(bsz, heads, q_len, v.shape[-1])


class DFlashTorchAttnBackend(AttentionBackend):
    """Torch-native attention for EXTEND (with cached prefix), DECODE, TARGET_VERIFY and ENCODER_ONLY."""

    def __init__(self, model_runner: ModelRunner) -> None:
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.use_swa_pool = isinstance(self.token_to_kv_pool, SWAKVPool) and (
            self.token_to_kv_pool.swa_layer_nums > 0
        )
        self.forward_metadata: PaddedBatch | None = None
        self.swa_out_cache_loc: torch.Tensor | None = None

    # -- metadata ----------------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        mode = forward_batch.forward_mode
        if mode.is_idle() or forward_batch.batch_size == 0:
            self.forward_metadata = None
            return
        req_pool = forward_batch.req_pool_indices.tolist()
        seq_lens = forward_batch.seq_lens.tolist()
        custom_mask = None
        if mode.is_decode():
            prefix_lens, q_lens = [s - 1 for s in seq_lens], [1] * len(seq_lens)
        elif mode.is_target_verify():
            per_req = forward_batch.out_cache_loc.shape[0] // len(seq_lens)
            prefix_lens, q_lens = seq_lens, [per_req] * len(seq_lens)
            custom_mask = getattr(forward_batch.spec_info, "custom_mask", None)
        else:
            prefix_lens = forward_batch.extend_prefix_lens.tolist()
            q_lens = forward_batch.extend_seq_lens.tolist()
        positions = forward_batch.positions
        if positions is not None and positions.dim() != 1:  # mrope [3, N]: windows use indices
            positions = None
        self.forward_metadata = build_padded_batch(
            req_to_token=self.req_to_token_pool.req_to_token,
            req_pool_indices=req_pool,
            prefix_lens=prefix_lens,
            q_lens=q_lens,
            out_cache_loc=forward_batch.out_cache_loc,
            positions=positions,
            custom_mask=custom_mask,
        )
        self.swa_out_cache_loc = None
        if self.use_swa_pool:
            self.swa_out_cache_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(
                forward_batch.out_cache_loc
            )

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def support_triton(self) -> bool:
        return False

    # -- forward -----------------------------------------------------------------------------------
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def _forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool,
        **kwargs: Any,
    ) -> torch.Tensor:
        """q [N, H*D] (or [N, H, D]) -> o [N, H*Dv]; writes k/v [N, Hk*D] to the pool when asked."""
        if layer.is_cross_attention or forward_batch.encoder_lens is not None:
            raise NotImplementedError("dflash_torch: cross attention is not supported")
        if kwargs.get("sinks") is not None:
            raise NotImplementedError("dflash_torch: attention sinks are not supported")
        if save_kv_cache and k is not None and v is not None:
            loc = KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc)
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
        num_tokens = q.shape[0]
        out = q.new_zeros(num_tokens, layer.tp_q_head_num, layer.v_head_dim)
        batch = self.forward_metadata
        if batch is None or num_tokens == 0:
            return out.view(num_tokens, -1)
        causal = layer.attn_type != AttentionType.ENCODER_ONLY
        window = layer.sliding_window_size if layer.sliding_window_size is not None else -1
        mask = batch_mask(batch, causal=causal, window=window)
        q_pad = q.reshape(num_tokens, layer.tp_q_head_num, layer.qk_head_dim)[batch.q_index]  # [B, Q, H, D]
        k_buf, v_buf = self._kv_buffers(layer)
        slots = self._read_slots(layer, batch.kv_slots)
        k_pad = k_buf[slots].to(q.dtype)  # [B, L, Hk, D]
        v_pad = v_buf[slots].to(q.dtype)  # [B, L, Hk, Dv]
        o_pad = masked_attention(
            q_pad.transpose(1, 2),
            k_pad.transpose(1, 2),
            v_pad.transpose(1, 2),
            mask,
            layer.scaling,
            float(layer.logit_cap or 0.0),
        ).transpose(1, 2)  # [B, Q, H, Dv]
        out[batch.q_index[batch.q_valid]] = o_pad[batch.q_valid].to(out.dtype)
        return out.view(num_tokens, -1)

    def _kv_buffers(self, layer: RadixAttention) -> tuple[torch.Tensor, torch.Tensor]:
        """Pool buffers [slots, Hk, D] / [slots, Hk, Dv] for this layer."""
        return (
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        )

    def _read_slots(self, layer: RadixAttention, slots: torch.Tensor) -> torch.Tensor:
        """Full-pool slots -> this layer's pool slots (only SWA layers of a hybrid SWA pool differ)."""
        if not self.use_swa_pool:
            return slots
        _, is_swa = self.token_to_kv_pool.layers_mapping[layer.layer_id]
        if not is_swa:
            return slots
        return self.token_to_kv_pool.translate_loc_from_full_to_swa(slots).clamp(min=0)


def create_dflash_torch_backend(model_runner: ModelRunner) -> DFlashTorchAttnBackend:
    """Factory registered in SGLang's ``ATTENTION_BACKENDS`` under ``dflash_torch``."""
    if getattr(model_runner, "use_mla_backend", False):
        raise NotImplementedError("dflash_torch: MLA models are not supported")
    return DFlashTorchAttnBackend(model_runner)
