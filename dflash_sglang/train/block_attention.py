"""Attention of the training step: K blocks per sequence, each over its context prefix and itself only.

A training batch packs K blocks of ``nb`` tokens per sequence. Block j's queries see the context keys
of positions < ``ctx_len[j]`` (its anchor; 0 for a padding block) and the nb keys of their own block,
never another block's. A dense mask over ``[context ; all K blocks]`` keys scores all of them: at K = 32,
nb = 16 and a 380-token context 56% of those scores are masked block-to-block pairs, and the masked
context tail (positions >= the anchor) is on average half of the rest. The CPU SDPA kernel pays for
every masked score, and a single unchunked softmax over [S, h, K*nb, L + K*nb] streams tens of MB per
pass. Here each sequence's blocks go in chunks of ``chunk`` blocks (anchors sorted, as
``recipe.sample_anchors`` draws them, keep a chunk's context spans close). A chunk's queries score
the context up to the chunk's largest ctx_len plus the chunk's own c*nb block keys, in one matmul and
one fp32 softmax, with an additive bias that hides context past each block's ctx_len and the chunk's
other blocks:

    keys  = [ctx_k[:Lc] ; the chunk's block k]           [kvh, Lc + c*nb, d]
    p     = softmax(scale * q . keys + bias)              [kvh, g, c*nb, Lc + c*nb]   (fp32)
    out   = p . [ctx_v[:Lc] ; the chunk's block v]

Block-to-block scores are computed for the chunk's c*nb x c*nb tile only (128 x 128 at c = 8; its
off-diagonal part in vain), not for the dense mask's K*nb x K*nb.

Grouped-query heads are handled by viewing the g = h / kvh query heads of a KV head as extra rows, so
keys and values are never repeated. The result equals ``core.layers.masked_attention`` over the dense
mask, values and gradients (``tests/train/test_block_attention.py``).
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 8  # blocks per chunk: 128 queries x 9 heads x (~600 + 128) keys is ~3.4 MB of fp32 scores


def block_attention(q: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, ctx_len: torch.Tensor, scale: float,
                    chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """q [S, K*nb, h, d]; ctx_k / ctx_v [S, L, kvh, d]; k / v [S, K*nb, kvh, d] (the blocks' own);
    ctx_len [S, K] int: block j sees context positions < ctx_len[:, j] (<= L) -> [S, K*nb, h, d]."""
    s, n, h, d = q.shape
    length, kvh = ctx_k.shape[1], ctx_k.shape[2]
    nblk = ctx_len.shape[1] if ctx_len.dim() == 2 else 0
    if ctx_len.shape != (s, nblk) or nblk == 0 or n % nblk or h % kvh or k.shape != (s, n, kvh, d) \
            or v.shape != k.shape or ctx_v.shape != ctx_k.shape or ctx_k.shape[::3] != (s, d):
        raise ValueError(f"block_attention: q {tuple(q.shape)}, ctx_k {tuple(ctx_k.shape)}, "
                         f"k {tuple(k.shape)}, ctx_len {tuple(ctx_len.shape)}: expected q [S, K*nb, h, d], "
                         "ctx_k/ctx_v [S, L, kvh, d], k/v [S, K*nb, kvh, d], ctx_len [S, K]")
    lens = ctx_len.tolist()  # one host read per call: chunk key spans are sizes, not tensor values
    longest = max(max(r) for r in lens)
    if longest > length:
        raise ValueError(f"block_attention: ctx_len up to {longest} > context length {length}")
    nb, g = n // nblk, h // kvh
    pos = torch.arange(length, device=q.device)
    rows = []
    # split / unbind, not indexing: the backward of each q[i, span] would zero-fill a whole q-sized grad
    per_seq = zip(*(t.unbind(0) for t in (q, ctx_k, ctx_v, k, v)), strict=True)
    for i, (qi, cki, cvi, ki, vi) in enumerate(per_seq):
        parts = []
        for j0, qc, kc, vc in zip(range(0, nblk, chunk), *(t.split(chunk * nb) for t in (qi, ki, vi)),
                                  strict=True):
            j1 = min(nblk, j0 + chunk)
            lc = max(lens[i][j0:j1])
            sees = pos[None, :lc] < ctx_len[i, j0:j1, None]  # [c, Lc]
            parts.append(_chunk(qc, cki[:lc], cvi[:lc], kc, vc, sees, nb, g, scale))
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def _chunk(q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           sees: torch.Tensor, nb: int, g: int, scale: float) -> torch.Tensor:
    """One sequence's chunk of c blocks: q [c*nb, h, d]; ck / cv [Lc, kvh, d]; k / v [c*nb, kvh, d];
    sees [c, Lc] bool -> [c*nb, h, d]."""
    n, h, d = q.shape
    c, lc, kvh = n // nb, ck.shape[0], ck.shape[1]
    blk = torch.arange(c, device=q.device).repeat_interleave(nb)
    vis = torch.cat([sees.repeat_interleave(nb, 0), blk[:, None] == blk[None, :]], dim=1)  # [c*nb, Lc + c*nb]
    bias = torch.zeros(vis.shape, dtype=torch.float32, device=q.device).masked_fill_(~vis, float("-inf"))
    qh = (q * scale).view(n, kvh, g, d).permute(1, 2, 0, 3).reshape(kvh, g * n, d)  # rows (g, c*nb)
    keys = torch.cat([ck, k]).transpose(0, 1)  # [kvh, Lc + c*nb, d]
    vals = torch.cat([cv, v]).transpose(0, 1)
    sc = torch.matmul(qh, keys.transpose(-1, -2)).view(kvh, g, n, lc + n).float() + bias
    p = torch.softmax(sc, dim=-1).to(vals.dtype).view(kvh, g * n, lc + n)
    out = torch.matmul(p, vals).view(kvh, g, n, d)
    return out.permute(2, 0, 1, 3).reshape(n, h, d).to(q.dtype)
