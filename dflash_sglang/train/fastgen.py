"""Continuous-batching greedy generation for Llama-family HF targets, capturing tap-layer outputs.

Self-distillation spends hours in the target's decode loop, so the loop matters. HF's forward over a
left-padded batch keeps finished rows in the batch until the longest answer ends, and its
DynamicCache grows by ``torch.cat`` every step: measured on this project's 2-core host (SmolLM2-135M,
fp32, batch 64, 300-token contexts) the cat alone was 80% of a decode step. This engine keeps one
preallocated K/V buffer per layer, ``[slots, kv_heads, max_len, head_dim]``, runs every slot's newest
token in one decode step, and gives a slot to the next prompt as soon as its answer ends (prefilled
causally, one prompt per forward).

It reuses the model's own modules (embedding, norms, projections, MLP, rotary embedding, LM head); only
the attention core and the cache are its own. :func:`supports` says whether a model has that shape
(Llama, Mistral, Qwen2, Qwen3: ``input_layernorm``, ``self_attn.{q,k,v,o}_proj`` with optional
``q_norm``/``k_norm``, ``post_attention_layernorm``, ``mlp``, ``model.rotary_emb``, no embedding
scale, no sliding window); anything else goes through :func:`dflash_sglang.train.data.answer_batch`.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Finished:
    index: int  # the caller's prompt index
    ids: list[int]  # prompt + answer (cut after the first EOS)
    prompt_len: int
    taps: torch.Tensor | None  # [len(ids) - 1, T*H] bf16: tap outputs of every token but the last


def supports(model: nn.Module) -> str | None:
    """None when the engine can run ``model``; else why not (one line)."""
    base = getattr(model, "model", None)
    cfg = model.config
    if base is None or not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
        return f"{type(model).__name__}: no model.layers / model.rotary_emb"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    layer = base.layers[0]
    attn = getattr(layer, "self_attn", None)
    need = ("q_proj", "k_proj", "v_proj", "o_proj")
    if attn is None or not all(hasattr(attn, n) for n in need) or not hasattr(layer, "mlp"):
        return f"{type(layer).__name__}: not a Llama-style decoder layer"
    if not hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb"):
        return f"{type(attn).__module__}: no apply_rotary_pos_emb"
    if type(base.embed_tokens) is not nn.Embedding:  # scaled embeddings (Gemma) need their own path
        return f"{type(base.embed_tokens).__name__}: not a plain embedding"
    return None


@dataclass
class _Slot:
    index: int
    ids: list[int]
    prompt_len: int
    taps: list[torch.Tensor] = field(default_factory=list)  # chunks [n, T*H]
    windows: set[tuple[int, ...]] = field(default_factory=set)  # answer windows seen (stop_on_loop)


class SlotGenerator:
    """Greedy answers for a stream of prompts over ``slots`` concurrent sequences.

    ``run(prompts)`` yields each prompt's :class:`Finished` as soon as its answer ends (EOS or
    ``max_new_tokens``), not in input order. A prompt longer than ``max_len - max_new_tokens`` raises.

    ``stop_on_loop`` W > 0 also ends an answer at the first token that completes a W-token window
    already seen in the same answer: the target has started repeating itself, and the rest would
    mostly be the same loop again (the answer stays an exact greedy prefix, only shorter).
    """

    def __init__(self, model: nn.Module, slots: int, max_len: int, max_new_tokens: int,
                 eos_token_ids: Iterable[int], tap_layer_ids: Iterable[int] = (),
                 prefill_tokens: int = 2048, stop_on_loop: int = 0) -> None:
        why = supports(model)
        if why:
            raise ValueError(f"SlotGenerator cannot run this model: {why}")
        self.model, self.base = model, model.model
        self.layers = list(self.base.layers)
        attn = self.layers[0].self_attn
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        cfg = model.config
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.slots, self.max_len, self.max_new = slots, max_len, max_new_tokens
        self.eos = set(int(e) for e in eos_token_ids)
        self.taps = tuple(tap_layer_ids)
        self.prefill_tokens = prefill_tokens
        self.stop_on_loop = stop_on_loop
        p = next(model.parameters())
        shape = (slots, self.kv_heads, max_len, self.head_dim)
        self.k = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in self.layers]
        self.lens = torch.zeros(slots, dtype=torch.long, device=p.device)  # tokens in each slot's cache
        self.head = model.get_output_embeddings().weight  # [V, H]

    # ----------------------------------------------------------------------------- driver
    @torch.no_grad()
    def run(self, prompts: Iterable[tuple[int, list[int]]]) -> Iterator[Finished]:
        queue = deque(prompts)
        live: dict[int, _Slot] = {}
        nxt = torch.zeros(self.slots, dtype=torch.long, device=self.lens.device)  # newest token per slot
        while queue or live:
            free = [s for s in range(self.slots) if s not in live]
            if free and queue:
                yield from self._admit(queue, free, live, nxt)
            if not live:
                continue
            hi = max(live) + 1
            tok, taps = self._decode(nxt[:hi], hi)
            for s in list(live):
                slot = live[s]
                slot.ids.append(int(nxt[s]))  # the token just run is now in the cache
                if taps is not None:
                    slot.taps.append(taps[s: s + 1])
                nxt[s] = tok[s]
                done = self._finish_if_done(s, slot, int(tok[s]))
                if done is not None:
                    del live[s]
                    yield done

    def _finish_if_done(self, s: int, slot: _Slot, token: int) -> Finished | None:
        """Appends nothing; ``token`` is the newly chosen next token of slot ``s``."""
        answered = len(slot.ids) - slot.prompt_len  # answer tokens already run through the model
        if token in self.eos or answered + 1 >= self.max_new or self._loops(slot, token):
            ids = slot.ids + [token]
            taps = torch.cat(slot.taps).to(torch.bfloat16) if self.taps else None
            self.lens[s] = 0
            return Finished(slot.index, ids, slot.prompt_len, taps)
        return None

    def _loops(self, slot: _Slot, token: int) -> bool:
        """Whether ``token`` completes an answer window of ``stop_on_loop`` tokens seen before."""
        w = self.stop_on_loop
        answered = len(slot.ids) - slot.prompt_len
        if w <= 0 or answered + 1 < w:
            return False
        window = (*slot.ids[len(slot.ids) - w + 1:], token) if w > 1 else (token,)
        if window in slot.windows:
            return True
        slot.windows.add(window)
        return False

    def _admit(self, queue: deque, free: list[int], live: dict[int, _Slot],
               nxt: torch.Tensor) -> Iterator[Finished]:
        """Prefill as many queued prompts as free slots (and the token budget) allow."""
        batch: list[tuple[int, int, list[int]]] = []  # (slot, index, ids)
        total = 0
        while queue and len(batch) < len(free):
            index, ids = queue[0]
            if len(ids) + self.max_new > self.max_len:
                raise ValueError(f"prompt {index}: {len(ids)} tokens + {self.max_new} new exceed max_len "
                                 f"{self.max_len}")
            if batch and total + len(ids) > self.prefill_tokens:
                break
            queue.popleft()
            batch.append((free[len(batch)], index, list(ids)))
            total += len(ids)
        first, taps = self._prefill(batch)
        off = 0
        for (s, index, ids), tok in zip(batch, first.tolist(), strict=True):
            slot = _Slot(index, ids, len(ids))
            if taps is not None:
                slot.taps.append(taps[off: off + len(ids)])
            off += len(ids)
            if self.max_new <= 1 or tok in self.eos:
                self.lens[s] = 0
                yield Finished(index, ids + [tok], len(ids),
                               torch.cat(slot.taps).to(torch.bfloat16) if self.taps else None)
                continue
            live[s] = slot
            nxt[s] = tok

    # ---------------------------------------------------------------------------- forward
    def _prefill(self, batch: list[tuple[int, int, list[int]]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prefills each prompt into its slot (causal). -> first tokens [P], taps [sum n, T*H] or None.

        One forward per prompt: packing several into one sequence needs a dense block-diagonal mask,
        and the CPU attention kernel then does the whole N x N square (measured: 38% of a run)."""
        dev = self.lens.device
        first, taps = [], []
        for s, _, ids in batch:
            n = len(ids)
            tokens = torch.tensor(ids, device=dev)[None]  # [1, n]
            pos = torch.arange(n, device=dev)[None]

            def attend(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: int = s,
                       n: int = n) -> torch.Tensor:
                self.k[li][s, :, :n] = k[0]
                self.v[li][s, :, :n] = v[0]
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                      scale=self.layers[li].self_attn.scaling)

            h, t = self._layers(tokens, pos, attend)
            self.lens[s] = n
            first.append(self._argmax(h[0, -1:]))
            if t is not None:
                taps.append(t[0])
        return torch.cat(first), (torch.cat(taps) if taps else None)

    def _decode(self, tok: torch.Tensor, hi: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token for slots [0, hi): -> next tokens [hi], taps [hi, T*H]. Idle slots compute garbage."""
        pos = self.lens[:hi].clone()  # [hi] position of the token being run
        ctx = int(pos.max()) + 1
        rows = torch.arange(hi, device=pos.device)
        mask = (torch.arange(ctx, device=pos.device)[None] <= pos[:, None])[:, None, None]  # [hi,1,1,ctx]
        g = self.heads // self.kv_heads

        def attend(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[li][rows, :, pos] = k[:, :, 0]
            self.v[li][rows, :, pos] = v[:, :, 0]
            # GQA folded into the query axis: [hi, kvh, g, hd] against [hi, kvh, ctx, hd]
            qf = q.reshape(hi, self.kv_heads, g, self.head_dim)
            o = F.scaled_dot_product_attention(qf, self.k[li][:hi, :, :ctx], self.v[li][:hi, :, :ctx],
                                               attn_mask=mask, scale=self.layers[li].self_attn.scaling)
            return o.reshape(hi, self.heads, 1, self.head_dim)

        h, taps = self._layers(tok[:, None], pos[:, None], attend)
        self.lens[:hi] += 1
        return self._argmax(h[:, 0]), (taps[:, 0] if taps is not None else None)

    def _layers(self, tokens: torch.Tensor, pos: torch.Tensor,
                attend) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens/pos [b, n] -> final-normed hidden [b, n, H], taps [b, n, T*H] (None without taps)."""
        x = self.base.embed_tokens(tokens)
        cos, sin = self.base.rotary_emb(x, pos)
        captured: dict[int, torch.Tensor] = {}
        b, n = tokens.shape
        for li, layer in enumerate(self.layers):
            a = layer.self_attn
            hin = layer.input_layernorm(x)
            shape = (b, n, -1, self.head_dim)
            q, k, v = a.q_proj(hin).view(shape), a.k_proj(hin).view(shape), a.v_proj(hin).view(shape)
            if getattr(a, "q_norm", None) is not None:
                q, k = a.q_norm(q), a.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            o = attend(li, q, k, v)  # [b, heads, n, hd]
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, n, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if li in self.taps:
                captured[li] = x
        taps = torch.cat([captured[i] for i in self.taps], dim=-1) if self.taps else None
        return self.base.norm(x), taps

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        return (h @ self.head.T).argmax(-1)
