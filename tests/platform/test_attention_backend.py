"""``dflash_torch`` attention against a naive per-query softmax attention written here.

Each case lays out B requests (cached prefix in scattered pool slots + new tokens), runs the backend's
forward for one layer, and compares every query row with ``naive_row`` over exactly the keys it may see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from dflash_sglang.platform.attention import DFlashTorchAttnBackend

H, HK, D, DV = 4, 2, 8, 8  # query heads, kv heads (GQA 2:1), qk dim, v dim
POOL_SLOTS = 512
MAX_CTX = 128


class FakePool:
    """The KV-pool surface the backend uses: per-layer [slots, Hk, D] buffers and a writer."""

    def __init__(self) -> None:
        self.k = torch.zeros(POOL_SLOTS, HK, D)
        self.v = torch.zeros(POOL_SLOTS, HK, DV)

    def set_kv_buffer(self, layer: object, loc: object, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[loc.loc] = k.view(-1, HK, D)
        self.v[loc.loc] = v.view(-1, HK, DV)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v


@dataclass
class Case:
    """B requests; new tokens of request b are queries; ``visible[b][i]`` = key indices query i sees."""

    prefix_lens: list[int]
    q_lens: list[int]
    visible: list[list[list[int]]]


def make_layer(*, encoder_only: bool = False, window: int = -1, logit_cap: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(
        layer_id=0,
        tp_q_head_num=H,
        tp_k_head_num=HK,
        qk_head_dim=D,
        v_head_dim=DV,
        scaling=1.0 / math.sqrt(D),
        logit_cap=logit_cap,
        sliding_window_size=window,
        attn_type=AttentionType.ENCODER_ONLY if encoder_only else AttentionType.DECODER,
        is_cross_attention=False,
    )


def naive_row(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layer: SimpleNamespace
) -> torch.Tensor:
    """q [H, D], keys [n, Hk, D], values [n, Hk, Dv] -> [H, Dv], one head at a time."""
    out = torch.empty(H, DV, dtype=torch.float64)
    for h in range(H):
        kh = h // (H // HK)
        scores = [float(q[h].double() @ keys[j, kh].double()) * layer.scaling for j in range(keys.shape[0])]
        if layer.logit_cap > 0:
            scores = [layer.logit_cap * math.tanh(s / layer.logit_cap) for s in scores]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        out[h] = sum(w / total * values[j, kh].double() for j, w in enumerate(weights))
    return out


def causal_visible(prefix: int, n: int, window: int = -1) -> list[list[int]]:
    rows = []
    for i in range(n):
        qpos = prefix + i
        rows.append([j for j in range(qpos + 1) if window < 0 or qpos - j <= window])
    return rows


def run_case(case: Case, mode: ForwardMode, layer: SimpleNamespace, custom_mask: torch.Tensor | None = None):
    """Returns (backend output [N, H, Dv], naive output [N, H, Dv])."""
    gen = torch.Generator().manual_seed(0)
    bs = len(case.q_lens)
    pool = FakePool()
    req_to_token = torch.zeros(bs + 1, MAX_CTX, dtype=torch.int32)
    free = torch.randperm(POOL_SLOTS - 1, generator=gen) + 1  # slot 0 stays the padding slot
    seq_k, seq_v, out_locs, req_ids = [], [], [], []
    for b, (p, n) in enumerate(zip(case.prefix_lens, case.q_lens, strict=True)):
        slots, free = free[: p + n], free[p + n :]
        k = torch.randn(p + n, HK, D, generator=gen)
        v = torch.randn(p + n, HK, DV, generator=gen)
        req = bs - b  # non-identity request-pool indices
        req_to_token[req, : p + n] = slots.to(torch.int32)
        pool.k[slots[:p]], pool.v[slots[:p]] = k[:p], v[:p]
        seq_k.append(k), seq_v.append(v), out_locs.append(slots[p:]), req_ids.append(req)
    num_tokens = sum(case.q_lens)
    q = torch.randn(num_tokens, H * D, generator=gen)
    new_k = torch.cat([k[p:] for k, p in zip(seq_k, case.prefix_lens, strict=True)]).view(num_tokens, -1)
    new_v = torch.cat([v[p:] for v, p in zip(seq_v, case.prefix_lens, strict=True)]).view(num_tokens, -1)
    positions = torch.cat(
        [torch.arange(p, p + n) for p, n in zip(case.prefix_lens, case.q_lens, strict=True)]
    )
    is_decode = mode == ForwardMode.DECODE
    seq_lens = [p + n for p, n in zip(case.prefix_lens, case.q_lens, strict=True)]
    if mode == ForwardMode.TARGET_VERIFY:
        seq_lens = list(case.prefix_lens)
    fb = SimpleNamespace(
        forward_mode=mode,
        batch_size=bs,
        req_pool_indices=torch.tensor(req_ids),
        seq_lens=torch.tensor(seq_lens),
        extend_prefix_lens=torch.tensor(case.prefix_lens),
        extend_seq_lens=torch.tensor(case.q_lens),
        out_cache_loc=torch.cat(out_locs).to(torch.int64),
        positions=positions,
        spec_info=SimpleNamespace(custom_mask=custom_mask),
        encoder_lens=None,
    )
    runner = SimpleNamespace(
        device=torch.device("cpu"),
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool=pool,
    )
    backend = DFlashTorchAttnBackend(runner)
    backend.init_forward_metadata(fb)
    forward = backend.forward_decode if is_decode else backend.forward_extend
    out = forward(q, new_k, new_v, layer, fb).view(num_tokens, H, DV)

    expected = torch.empty(num_tokens, H, DV, dtype=torch.float64)
    row = 0
    for b in range(bs):
        for i in range(case.q_lens[b]):
            keys = case.visible[b][i]
            expected[row] = naive_row(q[row].view(H, D), seq_k[b][keys], seq_v[b][keys], layer)
            row += 1
    return out, expected


def assert_close(
    case: Case, mode: ForwardMode, layer: SimpleNamespace, custom_mask: torch.Tensor | None = None
):
    out, expected = run_case(case, mode, layer, custom_mask)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_extend_with_cached_prefix_causal_gqa() -> None:
    prefix, q_lens = [0, 5, 17], [7, 3, 11]
    case = Case(prefix, q_lens, [causal_visible(p, n) for p, n in zip(prefix, q_lens, strict=True)])
    assert_close(case, ForwardMode.EXTEND, make_layer())


def test_decode_batch() -> None:
    prefix, q_lens = [4, 0, 30], [1, 1, 1]
    case = Case(prefix, q_lens, [causal_visible(p, n) for p, n in zip(prefix, q_lens, strict=True)])
    assert_close(case, ForwardMode.DECODE, make_layer())


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_sliding_window(mode: ForwardMode) -> None:
    window = 3
    prefix = [9, 2]
    q_lens = [6, 4] if mode == ForwardMode.EXTEND else [1, 1]
    case = Case(prefix, q_lens, [causal_visible(p, n, window) for p, n in zip(prefix, q_lens, strict=True)])
    assert_close(case, mode, make_layer(window=window))


def test_encoder_only_block_sees_prefix_and_whole_block() -> None:
    prefix, q_lens = [6, 0], [4, 5]
    visible = [[list(range(p + n))] * n for p, n in zip(prefix, q_lens, strict=True)]
    assert_close(Case(prefix, q_lens, visible), ForwardMode.EXTEND, make_layer(encoder_only=True))


def test_logit_cap() -> None:
    prefix, q_lens = [3], [4]
    case = Case(prefix, q_lens, [causal_visible(3, 4)])
    assert_close(case, ForwardMode.EXTEND, make_layer(logit_cap=0.5))


def test_target_verify_chain_without_mask() -> None:
    prefix, n = [5, 12], 4
    case = Case(prefix, [n, n], [causal_visible(p, n) for p in prefix])
    assert_close(case, ForwardMode.TARGET_VERIFY, make_layer())


def tree_mask(prefix: int, parents: list[int]) -> list[list[bool]]:
    """Rows [n, prefix + n]: a draft node sees the prefix, itself and its ancestors (parent -1 = root)."""
    n = len(parents)
    rows = []
    for i in range(n):
        row = [True] * prefix + [False] * n
        node = i
        while node >= 0:
            row[prefix + node] = True
            node = parents[node]
        rows.append(row)
    return rows


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_target_verify_custom_mask(kind: str) -> None:
    # Node 0 is the verified token; the tree branches twice (SGLang's flat per-request layout).
    parents = [-1, 0, 1, 2, 3] if kind == "chain" else [-1, 0, 0, 1, 2]
    prefix = [7, 3, 10]
    n = len(parents)
    masks = [tree_mask(p, parents) for p in prefix]
    visible = [[[j for j, ok in enumerate(row) if ok] for row in m] for m in masks]
    flat = torch.tensor([ok for m in masks for row in m for ok in row], dtype=torch.bool)
    assert_close(Case(prefix, [n] * 3, visible), ForwardMode.TARGET_VERIFY, make_layer(), custom_mask=flat)


def test_idle_batch_returns_empty() -> None:
    runner = SimpleNamespace(
        device=torch.device("cpu"),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(1, 4, dtype=torch.int32)),
        token_to_kv_pool=FakePool(),
    )
    backend = DFlashTorchAttnBackend(runner)
    fb = SimpleNamespace(forward_mode=ForwardMode.IDLE, batch_size=0)
    backend.init_forward_metadata(fb)
    assert backend.forward_metadata is None
