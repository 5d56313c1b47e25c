"""Torch replacements for SGLang's Triton/sgl_kernel helpers, against naive versions written here,
plus a guard that every hooked SGLang symbol still exists with the signature the patch expects."""

from __future__ import annotations

import importlib
import inspect
import os
import sys

import pytest
import torch

# ---------------------------------------------------------------------------------------------
# reconstruct_indices_from_tree_mask
# ---------------------------------------------------------------------------------------------


def naive_reconstruct(mask: torch.Tensor, seq_lens: list[int], n: int) -> dict[str, list[list[int]]]:
    """Straight from the definitions: ancestors, parent = deepest ancestor, first child/sibling."""
    out: dict[str, list[list[int]]] = {"positions": [], "index": [], "next_token": [], "next_sibling": []}
    for b, seq_len in enumerate(seq_lens):
        m = mask[b]
        anc = [[j for j in range(i) if m[i, j]] for i in range(n)]
        parent = [max(a) if a else -1 for a in anc]
        out["positions"].append([seq_len + len(anc[i]) for i in range(n)])
        out["index"].append([b * n + i for i in range(n)])
        out["next_token"].append([next((k for k in range(i + 1, n) if parent[k] == i), -1) for i in range(n)])
        out["next_sibling"].append(
            [
                -1 if parent[i] < 0 else next((k for k in range(i + 1, n) if parent[k] == parent[i]), -1)
                for i in range(n)
            ]
        )
    return out


def random_tree_mask(bs: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """[bs, n, n] bool: node 0 is the root, node i > 0 hangs under a random earlier node."""
    mask = torch.zeros(bs, n, n, dtype=torch.bool)
    for b in range(bs):
        for i in range(n):
            mask[b, i, i] = True
            if i:
                p = int(torch.randint(0, i, (1,), generator=gen))
                mask[b, i] |= mask[b, p]
    return mask


@pytest.mark.parametrize("n", [1, 4, 8])
def test_reconstruct_tree_matches_naive(n: int) -> None:
    from dflash_sglang.platform.patches.reconstruct_tree import reconstruct_indices_from_tree_mask_torch

    gen = torch.Generator().manual_seed(n)
    bs = 3
    mask = random_tree_mask(bs, n, gen)
    seq_lens = [5, 0, 17]
    positions = torch.full((bs * n,), -7, dtype=torch.int64)
    index = torch.full((bs, n), -7, dtype=torch.int64)
    next_token = torch.full((bs, n), -7, dtype=torch.int64)
    next_sibling = torch.full((bs, n), -7, dtype=torch.int64)
    reconstruct_indices_from_tree_mask_torch(
        mask.flatten(), torch.tensor(seq_lens), positions, index, next_token, next_sibling, bs, n
    )
    ref = naive_reconstruct(mask, seq_lens, n)
    assert positions.view(bs, n).tolist() == ref["positions"]
    assert index.tolist() == ref["index"]
    assert next_token.tolist() == ref["next_token"]
    assert next_sibling.tolist() == ref["next_sibling"]


def test_reconstruct_tree_apply_makes_module_importable_without_sgl_kernel() -> None:
    """After apply(), the SGLang module imports, calls our op, and sys.modules is left clean."""
    from dflash_sglang.platform.patches import reconstruct_tree

    had_sgl_kernel = "sgl_kernel" in sys.modules
    reconstruct_tree.apply()
    reconstruct_tree.apply()  # idempotent
    module = importlib.import_module(reconstruct_tree.TARGET_MODULE)
    assert (
        getattr(module, reconstruct_tree.TARGET_SYMBOL)
        is reconstruct_tree.reconstruct_indices_from_tree_mask_torch
    )
    assert ("sgl_kernel" in sys.modules) == had_sgl_kernel
    mask = random_tree_mask(2, 4, torch.Generator().manual_seed(1))
    outs = [torch.zeros(8, dtype=torch.int64)] + [torch.zeros(2, 4, dtype=torch.int64) for _ in range(3)]
    getattr(module, reconstruct_tree.WRAPPER_SYMBOL)(mask.flatten(), torch.tensor([3, 4]), *outs, 2, 4)
    assert outs[0].tolist() == [p for row in naive_reconstruct(mask, [3, 4], 4)["positions"] for p in row]


# ---------------------------------------------------------------------------------------------
# packed req_to_token gather / scatter (cache_locs)
# ---------------------------------------------------------------------------------------------


def naive_windows(req_pool: list[int], start: list[int], end: list[int]) -> list[tuple[int, int]]:
    """(row, col) of each packed element, request by request."""
    return [(r, c) for r, s, e in zip(req_pool, start, end, strict=True) for c in range(s, e)]


def test_assign_extend_cache_locs_matches_naive() -> None:
    from dflash_sglang.platform.patches.cache_locs import assign_extend_cache_locs_torch

    req_to_token = torch.arange(5 * 40, dtype=torch.int32).view(5, 40)
    req_pool, start, end = [3, 0, 4], [7, 0, 30], [11, 4, 34]  # 4 draft slots each
    out = assign_extend_cache_locs_torch(
        req_pool_indices=torch.tensor(req_pool),
        req_to_token=req_to_token,
        start_offset=torch.tensor(start),
        end_offset=torch.tensor(end),
        batch_size=3,
        draft_token_num=4,
        device="cpu",
    )
    assert out.dtype == torch.int64
    assert out.tolist() == [int(req_to_token[r, c]) for r, c in naive_windows(req_pool, start, end)]


def test_assign_req_to_token_pool_matches_naive() -> None:
    from dflash_sglang.platform.patches.cache_locs import assign_req_to_token_pool_torch

    req_to_token = torch.zeros(4, 20, dtype=torch.int32)
    expected = req_to_token.clone()
    req_pool, start, end = [2, 0, 3], [5, 0, 10], [8, 1, 14]  # ragged windows (3, 1, 4)
    locs = torch.arange(100, 108, dtype=torch.int64)
    for value, (r, c) in zip(locs.tolist(), naive_windows(req_pool, start, end), strict=True):
        expected[r, c] = value
    assign_req_to_token_pool_torch(
        torch.tensor(req_pool), req_to_token, torch.tensor(start), torch.tensor(end), locs, 3
    )
    assert torch.equal(req_to_token, expected)


def test_fill_front_out_cache_loc_matches_naive() -> None:
    from dflash_sglang.platform.patches.cache_locs import fill_front_out_cache_loc_torch

    out_cache_loc = torch.arange(50, 62, dtype=torch.int64)  # 3 requests x 4-wide window
    num_front = torch.tensor([2, 4, 1])
    front = torch.zeros(12, dtype=torch.int64)
    fill_front_out_cache_loc_torch(num_front, out_cache_loc, front)
    expected = [int(out_cache_loc[b * 4 + i]) for b, k in enumerate(num_front.tolist()) for i in range(k)]
    assert front[: len(expected)].tolist() == expected
    assert not front[len(expected) :].any()


# ---------------------------------------------------------------------------------------------
# post-verify bookkeeping (accept_locs) and greedy tree verification (verify_tree)
# ---------------------------------------------------------------------------------------------


def test_fill_accept_out_cache_loc_matches_naive() -> None:
    from dflash_sglang.platform.patches.accept_locs import fill_accept_out_cache_loc_torch

    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]], dtype=torch.int32)
    out_cache_loc = torch.arange(200, 209, dtype=torch.int64)
    dst = torch.zeros(9, dtype=torch.int64)
    fill_accept_out_cache_loc_torch(accept_index, out_cache_loc, dst, 9)
    kept = [int(out_cache_loc[i]) for i in accept_index.flatten().tolist() if i != -1]
    assert dst[: len(kept)].tolist() == kept


def test_fill_bonus_tokens_matches_naive() -> None:
    from dflash_sglang.platform.patches.accept_locs import fill_bonus_tokens_torch

    accept_tokens = torch.arange(12, dtype=torch.int64) + 1000  # 3 requests x stride 4
    accept_lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    bonus = torch.zeros(3, dtype=torch.int64)
    fill_bonus_tokens_torch(accept_tokens, accept_lens, bonus, 4, 3)
    assert bonus.tolist() == [int(accept_tokens[b * 4 + int(n) - 1]) for b, n in enumerate(accept_lens)]


def naive_verify(parents: list[int], cand: list[int], target: list[int], b: int, slots: int):
    """Greedy descent by definition: from node 0, take the lowest-index child whose token equals
    the target at the current node. Returns (accepted flat indices, {flat: predicted token})."""
    n = len(parents)
    node, accepted, writes = 0, [b * n], {}
    while len(accepted) < slots:
        match = [k for k in range(n) if parents[k] == node and cand[k] == target[node]]
        if not match:
            break
        writes[b * n + node] = target[node]
        node = match[0]
        accepted.append(b * n + node)
    writes[b * n + node] = target[node]
    return accepted, writes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verify_tree_greedy_matches_naive(seed: int) -> None:
    from dflash_sglang.platform.patches.reconstruct_tree import reconstruct_indices_from_tree_mask_torch
    from dflash_sglang.platform.patches.verify_tree import verify_tree_greedy_torch

    gen = torch.Generator().manual_seed(seed)
    bs, n, slots, vocab = 3, 8, 5, 3  # tiny vocab so that matches happen
    mask = random_tree_mask(bs, n, gen)
    positions = torch.zeros(bs * n, dtype=torch.int64)
    index, child, sibling = (torch.zeros(bs, n, dtype=torch.int64) for _ in range(3))
    reconstruct_indices_from_tree_mask_torch(
        mask.flatten(), torch.zeros(bs), positions, index, child, sibling, bs, n
    )
    cand = torch.randint(0, vocab, (bs, n), generator=gen)
    target = torch.randint(0, vocab, (bs, n), generator=gen)
    predicts = torch.full((bs * n,), -5, dtype=torch.int32)
    accept_index = torch.full((bs, slots), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    verify_tree_greedy_torch(predicts, accept_index, accept_num, cand, index, child, sibling, target)
    expected_predicts = [-5] * (bs * n)
    for b in range(bs):
        strict = mask[b] & torch.ones(n, n, dtype=torch.bool).tril(-1)
        parents = [max((j for j in range(i) if strict[i, j]), default=-1) for i in range(n)]
        accepted, writes = naive_verify(parents, cand[b].tolist(), target[b].tolist(), b, slots)
        assert accept_index[b].tolist() == accepted + [-1] * (slots - len(accepted))
        assert int(accept_num[b]) == len(accepted) - 1
        for flat, token in writes.items():
            expected_predicts[flat] = token
    assert predicts.tolist() == expected_predicts


def test_kv_pool_moves_with_torch() -> None:
    from dflash_sglang.platform.patches.kv_pool import TorchMoveMHATokenToKVPool

    pool = TorchMoveMHATokenToKVPool(
        64, page_size=1, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2,
        device="cpu", enable_memory_saver=False, enable_kv_cache_copy=True,
    )  # fmt: skip
    for layer in range(2):
        pool.k_buffer[layer].copy_(torch.randn_like(pool.k_buffer[layer]))
        pool.v_buffer[layer].copy_(torch.randn_like(pool.v_buffer[layer]))
    before_k = [buf.clone() for buf in pool.k_buffer]
    before_v = [buf.clone() for buf in pool.v_buffer]
    tgt, src = torch.tensor([3, 4, 5]), torch.tensor([10, 20, 30])
    pool.move_kv_cache(tgt, src)
    for layer in range(2):
        expected_k, expected_v = before_k[layer].clone(), before_v[layer].clone()
        expected_k[tgt], expected_v[tgt] = before_k[layer][src], before_v[layer][src]
        assert torch.equal(pool.k_buffer[layer], expected_k)
        assert torch.equal(pool.v_buffer[layer], expected_v)


# ---------------------------------------------------------------------------------------------
# Pinned-SGLang guard: every hooked symbol exists with the parameters the patch relies on.
# ---------------------------------------------------------------------------------------------

HOOKED_SYMBOLS: list[tuple[str, str, list[str]]] = [
    (
        "sglang.kernels.ops.speculative.reconstruct_tree",
        "reconstruct_indices_from_tree_mask_func",
        [
            "tree_mask",
            "verified_seq_len",
            "positions",
            "retrieve_index",
            "retrieve_next_token",
            "retrieve_next_sibling",
            "batch_size",
            "draft_token_num",
        ],
    ),
    (
        "sglang.kernels.ops.speculative.cache_locs",
        "assign_extend_cache_locs_func",
        [
            "req_pool_indices",
            "req_to_token",
            "start_offset",
            "end_offset",
            "batch_size",
            "draft_token_num",
            "device",
        ],
    ),
    ("sglang.srt.platforms.interface", "SRTPlatform.get_speculative_cache_locs_fn", ["self"]),
    ("sglang.srt.platforms.interface", "SRTPlatform.get_kv_pool_cls", ["self", "kind"]),
    ("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool._init_kv_copy_and_warmup", ["self"]),
    ("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool.move_kv_cache", ["self", "tgt_loc", "src_loc"]),
    (
        "sglang.srt.mem_cache.allocation",
        "assign_req_to_token_pool_func",
        ["req_pool_indices", "req_to_token", "start_offset", "end_offset", "out_cache_loc", "batch_size"],
    ),
    (
        "sglang.kernels.ops.speculative.cache_locs",
        "fill_front_out_cache_loc_func",
        ["num_front", "out_cache_loc", "front_out_cache_loc"],
    ),
    (
        "sglang.kernels.ops.speculative.eagle",
        "fill_accept_out_cache_loc_func",
        ["accept_index", "out_cache_loc", "accept_out_cache_loc", "size"],
    ),
    (
        "sglang.kernels.ops.speculative.eagle",
        "fill_bonus_tokens_func",
        ["accept_tokens", "accept_lens", "bonus_tokens", "accept_stride", "batch_size"],
    ),
    (
        "sglang.kernels.ops.speculative.spec_tree",
        "verify_tree_greedy_func",
        [
            "predicts",
            "accept_index",
            "accept_token_num",
            "candidates",
            "retrieve_index",
            "retrieve_next_token",
            "retrieve_next_sibling",
            "target_predict",
            "topk",
        ],
    ),
    ("sglang.srt.layers.attention.attention_registry", "register_attention_backend", ["name"]),
]


@pytest.mark.parametrize(("module_name", "qualname", "params"), HOOKED_SYMBOLS, ids=lambda x: str(x)[:60])
def test_hooked_symbol_signature(module_name: str, qualname: str, params: list[str]) -> None:
    from dflash_sglang.platform.patches import reconstruct_tree

    reconstruct_tree.apply()  # the reconstruct_tree module only imports once patched
    obj: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    assert list(inspect.signature(obj).parameters) == params


def test_patches_refuse_other_sglang_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang

    from dflash_sglang.platform.patches import apply_all

    monkeypatch.setattr(sglang, "__version__", "0.0.0")
    with pytest.raises(RuntimeError, match="0.5.23"):
        apply_all()


def test_platform_inactive_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from dflash_sglang.platform import PLATFORM_CLASS, PLATFORM_NAME, activate

    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    assert activate() is None
    monkeypatch.setenv("SGLANG_PLATFORM", "cuda")
    assert activate() is None
    monkeypatch.setenv("SGLANG_PLATFORM", PLATFORM_NAME)
    assert activate() == PLATFORM_CLASS
    assert os.environ["SGLANG_PLATFORM"] == PLATFORM_NAME


def test_entry_point_registered() -> None:
    from importlib.metadata import entry_points

    from dflash_sglang.platform import PLATFORM_NAME

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.platforms")}
    assert eps.get(PLATFORM_NAME) == "dflash_sglang.platform:activate"


def test_install_registers_backend_and_choices() -> None:
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from dflash_sglang.platform import ATTENTION_BACKEND_NAME
    from dflash_sglang.platform.attention import create_dflash_torch_backend
    from dflash_sglang.platform.install import register_attention_backend, register_choices

    register_choices()
    register_choices()  # idempotent
    register_attention_backend()
    assert choices.ATTENTION_BACKEND_CHOICES.count(ATTENTION_BACKEND_NAME) == 1
    # The DFlash draft worker keeps a draft backend only if it is in this list (draft_worker_common).
    assert choices.DRAFT_ATTENTION_BACKEND_CHOICES.count(ATTENTION_BACKEND_NAME) == 1
    assert ATTENTION_BACKENDS[ATTENTION_BACKEND_NAME] is create_dflash_torch_backend


def test_platform_declarations() -> None:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from dflash_sglang.platform import ATTENTION_BACKEND_NAME
    from dflash_sglang.platform.patches.cache_locs import assign_extend_cache_locs_torch
    from dflash_sglang.platform.platform import DFlashCpuPlatform

    platform = DFlashCpuPlatform()
    assert platform.is_out_of_tree() and not platform.is_cuda_alike()
    assert platform.get_device() == "cpu"
    assert not platform.capabilities.supports_triton and not platform.capabilities.graph_capture
    assert platform.get_default_attention_backend() == ATTENTION_BACKEND_NAME
    assert platform.get_default_speculative_draft_attention_backend("DFLASH") == ATTENTION_BACKEND_NAME
    assert platform.supports_speculative_algorithm("NGRAM") and platform.supports_speculative_algorithm(
        "DFLASH"
    )
    assert not platform.supports_speculative_algorithm("EAGLE3")
    assert platform.get_speculative_cache_locs_fn() is assign_extend_cache_locs_torch
    assert issubclass(platform.get_kv_pool_cls(kind="mha"), MHATokenToKVPool)
    assert platform.get_kv_pool_cls(kind="mla") is None


def test_apply_all_routes_sglang_symbols_to_torch() -> None:
    """After apply_all(), calling SGLang's own (Triton-only) entry points works on the CPU."""
    from sglang.kernels.ops.speculative import cache_locs, eagle, spec_tree
    from sglang.srt.mem_cache import allocation

    from dflash_sglang.platform.patches import apply_all

    apply_all()
    apply_all()  # idempotent
    req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    allocation.assign_req_to_token_pool_func(
        torch.tensor([1]), req_to_token, torch.tensor([2]), torch.tensor([4]), torch.tensor([7, 9]), 1
    )
    assert req_to_token[1, 2:4].tolist() == [7, 9]
    front = torch.zeros(4, dtype=torch.int64)
    cache_locs.fill_front_out_cache_loc_func(torch.tensor([1, 2]), torch.arange(4), front)
    assert front[:3].tolist() == [0, 2, 3]
    dst = torch.zeros(3, dtype=torch.int64)
    eagle.fill_accept_out_cache_loc_func(torch.tensor([[0, -1], [2, 3]]), torch.arange(10, 14), dst, 4)
    assert dst.tolist() == [10, 12, 13]
    bonus = torch.zeros(1, dtype=torch.int64)
    eagle.fill_bonus_tokens_func(torch.tensor([5, 6]), torch.tensor([2]), bonus, 2, 1)
    assert bonus.tolist() == [6]
    # A 2-node chain whose draft matches the target: one accepted draft plus the bonus token.
    predicts = torch.zeros(2, dtype=torch.int32)
    accept_index = torch.full((1, 2), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    spec_tree.verify_tree_greedy_func(
        predicts, accept_index, accept_num, torch.tensor([[4, 8]]), torch.tensor([[0, 1]]),
        torch.tensor([[1, -1]]), torch.tensor([[-1, -1]]), torch.tensor([[8, 3]]),
    )  # fmt: skip
    assert accept_index.tolist() == [[0, 1]] and accept_num.tolist() == [1] and predicts.tolist() == [8, 3]
