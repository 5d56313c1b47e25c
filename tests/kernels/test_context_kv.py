"""Fused context-KV kernel vs its torch reference, and the reference vs DFlashDrafter.context_kv."""

from __future__ import annotations

import pytest
import torch
from kernel_test_helpers import gen, tiny_drafter

from dflash_sglang.core.kernel_ref import (
    context_k_v_ref,
    context_kv_to_pool_ref,
    project_context_kv,
    stacked_kv_weights,
)
from dflash_sglang.kernels import context_kv_to_pool, drafter_context_kv_to_pool

THETA, EPS = 1e6, 1e-6


def _inputs(n: int, layers: int, kvh: int, d: int, slots: int, dtype: torch.dtype, seed: int = 0):
    g = gen(seed)
    kv = (torch.randn(n, layers, 2, kvh, d, generator=g) * 3).to(dtype)
    w = (1 + 0.3 * torch.randn(layers, d, generator=g)).to(dtype)
    pos = torch.randint(0, 60000, (n,), generator=g)
    loc = torch.randperm(slots, generator=g)[:n]
    return kv, w, pos, loc


def _pools(layers: int, slots: int, kvh: int, d: int, dtype: torch.dtype):
    k = torch.full((layers, slots, kvh, d), 7.0, dtype=dtype)  # sentinel: untouched slots stay 7
    return k, k.clone()


def _assert_pools_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to rare one-ulp differences (fp32 rounding of the norm statistics and of cos/sin)."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-3)
    assert (got != want).float().mean().item() < 0.01


@pytest.mark.parametrize(
    "dtype,n,layers,kvh,d",
    [
        (torch.bfloat16, 12, 2, 2, 32),
        (torch.float16, 9, 3, 1, 16),
        (torch.float32, 10, 2, 3, 48),  # kvh and d/2 not powers of two
    ],
)
def test_kernel_matches_reference_4d_pool(dtype: torch.dtype, n: int, layers: int, kvh: int, d: int) -> None:
    slots = 3 * n
    kv, w, pos, loc = _inputs(n, layers, kvh, d, slots, dtype)
    loc[1] = -1  # padding entry: skipped
    kp, vp = _pools(layers, slots, kvh, d, dtype)
    kr, vr = _pools(layers, slots, kvh, d, dtype)
    context_kv_to_pool(kv, w, pos, loc, kp, vp, THETA, EPS)
    context_kv_to_pool_ref(kv, w, pos, loc, kr, vr, THETA, EPS)
    assert torch.equal(vp, vr)
    _assert_pools_close(kp, kr)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[loc[loc >= 0]] = False
    assert bool((kp[:, untouched] == 7).all()) and bool((vp[:, untouched] == 7).all())


def test_kernel_per_layer_pools_strided_kv_int32_indices() -> None:
    """List-of-layers pools (SGLang style), kv as a strided view of a wider GEMM output, int32 ids."""
    n, layers, kvh, d, slots = 8, 2, 2, 16, 20
    dtype = torch.bfloat16
    g = gen(3)
    wide = torch.randn(n, layers * 2 * kvh * d + 5, generator=g).to(dtype)
    kv = wide[:, :-5].unflatten(1, (layers, 2, kvh, d))  # row stride != row length
    assert not kv.is_contiguous()
    w = (1 + 0.3 * torch.randn(layers, d, generator=g)).to(dtype)
    pos = torch.randint(0, 5000, (n,), generator=g, dtype=torch.int32)
    loc = torch.randperm(slots, generator=g)[:n].to(torch.int32)
    kp = [torch.zeros(slots, kvh, d, dtype=dtype) for _ in range(layers)]
    vp = [torch.zeros(slots, kvh, d, dtype=dtype) for _ in range(layers)]
    kr = [t.clone() for t in kp]
    vr = [t.clone() for t in vp]
    context_kv_to_pool(kv, w, pos, loc, kp, vp, THETA, EPS)
    context_kv_to_pool_ref(kv, w, pos, loc, kr, vr, THETA, EPS)
    for layer in range(layers):
        assert torch.equal(vp[layer], vr[layer])
        _assert_pools_close(kp[layer], kr[layer])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_reference_is_bit_identical_to_drafter_context_kv(dtype: torch.dtype, bias: bool) -> None:
    drafter = tiny_drafter(dtype, attention_bias=bias)
    cfg = drafter.cfg
    g = gen(1)
    taps = torch.randn(7, cfg.num_taps * cfg.hidden_size, generator=g).to(dtype)
    pos = torch.randint(0, 30000, (7,), generator=g)
    with torch.no_grad():
        want_k, want_v = drafter.context_kv(taps, pos)
        c = drafter.fuse_context(taps)
        attns = [layer.self_attn for layer in drafter.layers]
        per_layer = [t for a in attns for t in (a.k_proj(c), a.v_proj(c))]
        kv = torch.stack(per_layer, dim=1).view(7, cfg.num_hidden_layers, 2, cfg.num_key_value_heads, -1)
        _, _, k_norm_w = stacked_kv_weights(drafter)
        k, v = context_k_v_ref(kv, k_norm_w, pos, cfg.rope_theta, cfg.rms_norm_eps)
    for layer in range(cfg.num_hidden_layers):
        assert torch.equal(k[:, layer], want_k[layer])
        assert torch.equal(v[:, layer], want_v[layer])


def test_stacked_gemm_matches_per_layer_projections() -> None:
    drafter = tiny_drafter(torch.float32, attention_bias=True)
    cfg = drafter.cfg
    c = torch.randn(5, cfg.hidden_size, generator=gen(2))
    w, b, _ = stacked_kv_weights(drafter)
    with torch.no_grad():
        kv = project_context_kv(c, w, b, cfg.num_hidden_layers, cfg.num_key_value_heads)
        for i, layer in enumerate(drafter.layers):
            k = layer.self_attn.k_proj(c).view(5, cfg.num_key_value_heads, -1)
            torch.testing.assert_close(kv[:, i, 0], k)
            torch.testing.assert_close(kv[:, i, 1], layer.self_attn.v_proj(c).view_as(k))


def test_drafter_path_into_pool_matches_context_kv() -> None:
    drafter = tiny_drafter(torch.bfloat16)
    cfg = drafter.cfg
    n, slots = 6, 16
    g = gen(4)
    taps = torch.randn(n, cfg.num_taps * cfg.hidden_size, generator=g).bfloat16()
    pos = torch.arange(100, 100 + n)
    loc = torch.randperm(slots, generator=g)[:n]
    kp, vp = _pools(cfg.num_hidden_layers, slots, cfg.num_key_value_heads, cfg.head_dim, torch.bfloat16)
    with torch.no_grad():
        drafter_context_kv_to_pool(drafter, taps, pos, loc, kp, vp)
        want_k, want_v = drafter.context_kv(taps, pos)
    for layer in range(cfg.num_hidden_layers):
        # One stacked GEMM vs per-layer GEMMs may round differently in bf16: compare loosely.
        torch.testing.assert_close(kp[layer, loc], want_k[layer], rtol=0.05, atol=0.05)
        torch.testing.assert_close(vp[layer, loc], want_v[layer], rtol=0.05, atol=0.05)


def _good():
    kv, w, pos, loc = _inputs(4, 2, 2, 16, 8, torch.float32)
    kp, vp = _pools(2, 8, 2, 16, torch.float32)
    return dict(
        kv=kv,
        k_norm_weight=w,
        positions=pos,
        out_cache_loc=loc,
        k_pool=kp,
        v_pool=vp,
        rope_theta=THETA,
        eps=EPS,
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.update(kv=a["kv"][:, :, :1]), r"kv must be \[N, L, 2, kvh, d\]"),
        (lambda a: a.update(kv=a["kv"][..., :15]), "head_dim must be even"),
        (lambda a: a.update(k_norm_weight=a["k_norm_weight"][:1]), r"k_norm_weight must be \[L, d\]"),
        (lambda a: a.update(positions=a["positions"][:3]), r"positions must be \[N\]"),
        (lambda a: a.update(out_cache_loc=a["out_cache_loc"].float()), "out_cache_loc must be int32/int64"),
        (lambda a: a.update(kv=a["kv"].double()), "kv must be float32/float16/bfloat16"),
        (lambda a: a.update(k_pool=a["k_pool"].bfloat16()), "k_pool dtype torch.bfloat16 must equal kv"),
        (lambda a: a.update(v_pool=a["v_pool"][:, :, :1]), r"v_pool must be \(2, 8, 2, 16\)"),
        (lambda a: a.update(k_pool=a["k_pool"][0]), r"k_pool must be \[L, num_slots, kvh, d\]"),
        (lambda a: a.update(k_pool=list(a["k_pool"])), "both be 4-D tensors or both lists"),
        (lambda a: a.update(k_pool=list(a["k_pool"])[:1], v_pool=list(a["v_pool"])[:1]), "one k and one v"),
        (lambda a: a.update(kv=a["kv"].transpose(3, 4).contiguous().transpose(3, 4)), "contiguous last dim"),
        (lambda a: a.update(positions=a["positions"].to("meta")), "all tensors must be on one device"),
    ],
)
def test_wrapper_rejects_bad_arguments(change, match: str) -> None:
    args = _good()
    change(args)
    with pytest.raises(ValueError, match=match) as err:
        context_kv_to_pool(**args)
    assert "\n" not in str(err.value)
