"""The training step's block attention equals masked attention over the dense [context ; blocks] mask."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.layers import masked_attention
from dflash_sglang.train.block_attention import block_attention


def dense_mask(ctx_len: torch.Tensor, length: int, nb: int) -> torch.Tensor:
    """ctx_len [S, K] -> [S, 1, K*nb, L + K*nb]: context below each block's ctx_len, plus the
    block-diagonal own-block part."""
    s, blocks = ctx_len.shape
    to_ctx = torch.arange(length)[None, None] < ctx_len.repeat_interleave(nb, 1)[:, :, None]
    blk = torch.arange(blocks).repeat_interleave(nb)
    own = (blk[:, None] == blk[None, :]).expand(s, -1, -1)
    return torch.cat([to_ctx, own], dim=2)[:, None]


@pytest.mark.parametrize(("heads", "kv_heads", "blocks", "nb", "chunk"),
                         [(9, 3, 4, 16, 8), (9, 3, 7, 4, 3), (4, 4, 3, 5, 1), (6, 1, 1, 8, 8)])
def test_equals_masked_attention_over_the_dense_mask(heads: int, kv_heads: int, blocks: int, nb: int,
                                                     chunk: int) -> None:
    g = torch.Generator().manual_seed(heads * 100 + blocks)
    s, length, d = 2, 23, 16
    n = blocks * nb
    q = torch.randn(s, n, heads, d, generator=g)
    ctx_k, ctx_v = torch.randn(2, s, length, kv_heads, d, generator=g)
    k, v = torch.randn(2, s, n, kv_heads, d, generator=g)
    ctx_len = torch.randint(0, length + 1, (s, blocks), generator=g)  # unsorted: chunks need no order
    ctx_len[0, 0] = 0  # a block with no context at all (a padding block): only its own keys
    ctx_len[1, -1] = length
    want = masked_attention(q, torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1),
                            dense_mask(ctx_len, length, nb), 0.25)
    got = block_attention(q, ctx_k, ctx_v, k, v, ctx_len, 0.25, chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_equal_the_dense_attention() -> None:
    g = torch.Generator().manual_seed(7)
    s, length, heads, kvh, d, blocks, nb = 2, 11, 4, 2, 8, 3, 4
    n = blocks * nb
    leaves = [torch.randn(s, n, heads, d, generator=g), *torch.randn(2, s, length, kvh, d, generator=g),
              *torch.randn(2, s, n, kvh, d, generator=g)]
    ctx_len = torch.tensor([[0, 5, 11], [7, 2, 9]])
    grads = []
    for fn in ("dense", "block"):
        q, ck, cv, k, v = (t.clone().requires_grad_() for t in leaves)
        if fn == "dense":
            out = masked_attention(q, torch.cat([ck, k], 1), torch.cat([cv, v], 1),
                                   dense_mask(ctx_len, length, nb), 0.3)
        else:
            out = block_attention(q, ck, cv, k, v, ctx_len, 0.3, chunk=2)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append([t.grad for t in (q, ck, cv, k, v)])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_rejects_mismatched_shapes() -> None:
    q = torch.zeros(1, 32, 4, 8)
    kv = torch.zeros(1, 10, 2, 8)
    own = torch.zeros(1, 32, 2, 8)
    with pytest.raises(ValueError, match="expected q"):
        block_attention(q, kv, kv, own, own, torch.zeros(1, 5, dtype=torch.long), 1.0)  # 32 % 5 blocks
    with pytest.raises(ValueError, match="> context length"):
        block_attention(q, kv, kv, own, own, torch.full((1, 2), 11), 1.0)
