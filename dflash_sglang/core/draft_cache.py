"""Position-indexed draft context KV for the reference engine.

Invariant: for request row b, slot p of every layer holds the drafter's context key/value of the
committed token at absolute position p, for p < ctx_len[b]. The drafter's context is exactly the
tokens whose target hidden states are known: every committed token except the newest (the bonus),
which has not been through the target yet. The SGLang worker keeps the same invariant in SGLang's
KV pool, at the slots where the target keeps its own KV.
"""

from __future__ import annotations

import torch

from .drafter import ContextKV, DFlashDrafter


class DraftContextCache:
    def __init__(self, drafter: DFlashDrafter, bs: int, capacity: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        cfg = drafter.cfg
        shape = (bs, capacity, cfg.num_key_value_heads, cfg.head_dim)
        self.drafter = drafter
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.ctx_len = torch.zeros(bs, dtype=torch.long, device=device)  # [bs]
        self.injected = 0  # total context positions projected (for tests and stats)

    @torch.no_grad()
    def inject(self, taps: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """taps [bs, n, T*H], positions [bs, n], valid [bs, n]: write valid entries at their positions.

        Valid entries of a row must be the contiguous positions ctx_len[b] .. ctx_len[b] + count - 1.
        """
        rows = torch.arange(taps.shape[0], device=taps.device)[:, None].expand_as(positions)
        r, p = rows[valid], positions[valid]
        ks, vs = self.drafter.context_kv(taps[valid], p)  # L x [N, kvh, d]
        for layer in range(len(self.keys)):
            self.keys[layer][r, p] = ks[layer].to(self.keys[layer].dtype)
            self.values[layer][r, p] = vs[layer].to(self.values[layer].dtype)
        self.ctx_len += valid.sum(dim=1)
        self.injected += int(p.numel())

    def view(self) -> ContextKV:
        c = int(self.ctx_len.max())
        pos = torch.arange(c, device=self.ctx_len.device)
        return ContextKV(
            keys=[k[:, :c] for k in self.keys],
            values=[v[:, :c] for v in self.values],
            positions=pos[None].expand(self.ctx_len.shape[0], c),
            valid=pos[None] < self.ctx_len[:, None],
        )

    def select(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.ctx_len = self.ctx_len[rows]
