"""One-shot GPU check of the DFlash GPU path on a bare CUDA machine (torch + triton, no sglang).

Sections (each guarded: a failure is recorded and the rest still runs; JSON is always written):
  1. correctness - every Triton kernel against its torch reference (core/kernel_ref.py) on random
     inputs at serving shapes, the references against core (drafter.context_kv, greedy_verify), and a
     chi-square test of the rejection-sampling kernel's first committed token.
  2. kernels     - CUDA-event timings (warmup, L2 flushed before each timed call, median) of each
     kernel vs its torch reference, and vs the HBM roofline: bytes moved / --peak-bw-tbs.
  3. models      - draft step (context-KV injection of the B new tokens + 5-layer drafter on a block
     + LM head + argmax) vs target verify (36-layer dense Qwen3-8B-shaped target on the block with a
     KV cache of --ctx tokens + LM head + greedy accept), random bf16 weights, batch 1/8/32, eager
     and CUDA-graph replay.
  4. overlap     - drafter graph on a side stream (ordered by events) concurrently with the target
     graph of an independent micro-batch, vs the two run back to back on one stream.

Usage: scripts/gpu_check.sh --out gpu_check.json [--peak-bw-tbs 4.8] [--dry-run]
``--dry-run`` runs everything on CPU with tiny shapes (kernels through the Triton interpreter,
no streams or graphs, timings meaningless) and marks the JSON ``dry_run: true``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_check.json", help="where to write the JSON results")
    ap.add_argument("--peak-bw-tbs", type=float, default=4.8, help="HBM peak bandwidth in TB/s (H200: 4.8)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, interpreter; no timing claims")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32)")
    ap.add_argument("--block", type=int, default=None, help="block size (default 16)")
    ap.add_argument("--ctx", type=int, default=None, help="context tokens in the KV caches (default 1024)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per measurement (default 20)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup iterations (default 5)")
    ap.add_argument("--skip-models", action="store_true", help="kernels only (sections 1-2)")
    ap.add_argument("--time-budget-s", type=float, default=450.0,
                    help="skip the remaining sections once this much wall time has passed")
    return ap.parse_args(argv)


ARGS = parse_args()
if ARGS.dry_run:  # must precede the first import of triton / kernels (kernels specialise at import)
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(REPO))  # dflash_sglang from this checkout (nothing is installed on a bare GPU box)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import dflash_sglang.kernels as kernels  # noqa: E402
from dflash_sglang.core import kernel_ref as ref  # noqa: E402
from dflash_sglang.core.config import DFlashConfig  # noqa: E402
from dflash_sglang.core.drafter import ContextKV, DFlashDrafter  # noqa: E402
from dflash_sglang.core.layers import apply_rope, rope_cos_sin  # noqa: E402
from dflash_sglang.core.verify import greedy_verify  # noqa: E402


# ---------------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    target_layers: int
    draft_layers: int
    vocab: int
    taps: tuple[int, ...]
    block: int
    ctx: int
    batches: tuple[int, ...]
    ctx_kv_tokens: tuple[int, ...]  # N for the context-KV kernel benchmark
    pool_slots: int
    chi2_rows: int
    rope_theta: float = 1e6
    eps: float = 1e-6


QWEN3_8B = Shapes(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=12288, target_layers=36,
                  draft_layers=5, vocab=151936, taps=(1, 9, 17, 25, 33), block=16, ctx=1024,
                  batches=(1, 8, 32), ctx_kv_tokens=(16, 512, 8192), pool_slots=65536, chi2_rows=200_000)
TINY = Shapes(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128, target_layers=4, draft_layers=2,
              vocab=512, taps=(1, 2), block=4, ctx=32, batches=(1, 2), ctx_kv_tokens=(8,), pool_slots=64,
              chi2_rows=200)


def shapes_from_args(a: argparse.Namespace) -> Shapes:
    s = TINY if a.dry_run else QWEN3_8B
    upd: dict[str, Any] = {}
    if a.batches:
        upd["batches"] = tuple(int(x) for x in a.batches.split(","))
    if a.block:
        upd["block"] = a.block
    if a.ctx:
        upd["ctx"] = a.ctx
    return Shapes(**{**asdict(s), **upd}) if upd else s


# ---------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------
class Clock:
    """CUDA-event timer (per-call events, optional L2 flush between calls); perf_counter on CPU."""

    def __init__(self, device: torch.device, warmup: int, iters: int) -> None:
        self.cuda = device.type == "cuda"
        self.warmup, self.iters = warmup, iters
        self.flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device=device) if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any], flush: bool = False) -> dict[str, float]:
        for _ in range(self.warmup):
            fn()
        self.sync()
        pairs, times = [], []
        for _ in range(self.iters):
            if flush and self.flush_buf is not None:
                self.flush_buf.zero_()
            if self.cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                pairs.append((s, e))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        self.sync()
        if self.cuda:
            times = [s.elapsed_time(e) for s, e in pairs]
        times.sort()
        return {"median_ms": times[len(times) // 2], "min_ms": times[0]}


# ---------------------------------------------------------------------------------------------------
# random inputs
# ---------------------------------------------------------------------------------------------------
def ctx_kv_inputs(n: int, sh: Shapes, device: torch.device, dtype: torch.dtype, g: torch.Generator):
    kv = torch.randn(n, sh.draft_layers, 2, sh.kv_heads, sh.head_dim, generator=g, device=device).to(dtype)
    w = (1 + 0.2 * torch.randn(sh.draft_layers, sh.head_dim, generator=g, device=device)).to(dtype)
    pos = torch.randint(0, 32768, (n,), generator=g, device=device)
    slots = max(sh.pool_slots, n)
    loc = torch.randperm(slots, generator=g, device=device)[:n]
    pool = torch.zeros(sh.draft_layers, slots, sh.kv_heads, sh.head_dim, dtype=dtype, device=device)
    return kv, w, pos, loc, pool, pool.clone()


def greedy_inputs(bs: int, sh: Shapes, device: torch.device, g: torch.Generator):
    ids = torch.randint(0, sh.vocab, (bs, sh.block), generator=g, device=device)
    other = torch.randint(0, sh.vocab, (bs, sh.block - 1), generator=g, device=device)
    agree = torch.rand(bs, sh.block - 1, generator=g, device=device) < 0.85
    first = torch.randint(0, sh.vocab, (bs, 1), generator=g, device=device)
    block = torch.cat([first, torch.where(agree, ids[:, :-1], other)], dim=1)
    valid = torch.randint(1, sh.block + 1, (bs,), generator=g, device=device)
    return block, ids, valid


def rejection_inputs(bs: int, block: int, vocab: int, device: torch.device, g: torch.Generator):
    p = torch.softmax(torch.randn(bs, block, vocab, generator=g, device=device) * 3, dim=-1)
    noise = torch.softmax(torch.randn(bs, block - 1, vocab, generator=g, device=device) * 3, dim=-1)
    q = 0.8 * p[:, :-1] + 0.2 * noise
    d = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(bs, block - 1)
    tokens = torch.cat([torch.zeros(bs, 1, dtype=torch.int64, device=device), d], dim=1)
    u = torch.rand(bs, block - 1, generator=g, device=device)
    bu = torch.rand(bs, generator=g, device=device)
    valid = torch.randint(1, block + 1, (bs,), generator=g, device=device)
    return tokens, p, q, u, bu, valid


def same_result(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("accept_len", "bonus", "committed"))


# ---------------------------------------------------------------------------------------------------
# 1. correctness
# ---------------------------------------------------------------------------------------------------
def check_kernels(sh: Shapes, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(0)
    out: list[dict[str, Any]] = []

    def record(name: str, ok: bool, **detail: Any) -> None:
        out.append({"name": name, "ok": bool(ok), **detail})

    # context KV: 4-D pool and per-layer pools, padding slot.
    n = max(sh.ctx_kv_tokens[:2])
    kv, w, pos, loc, kp, vp = ctx_kv_inputs(n, sh, device, dtype, g)
    loc[0] = -1
    kr, vr = kp.clone(), vp.clone()
    kernels.context_kv_to_pool(kv, w, pos, loc, kp, vp, sh.rope_theta, sh.eps)
    ref.context_kv_to_pool_ref(kv, w, pos, loc, kr, vr, sh.rope_theta, sh.eps)
    diff = (kp.float() - kr.float()).abs()
    mism = float((kp != kr).float().mean())
    tol = bool(torch.allclose(kp.float(), kr.float(), rtol=2 ** -7, atol=1e-3))
    record("context_kv 4d pool", tol and mism < 0.01 and torch.equal(vp, vr), n=n, dtype=str(dtype),
           max_abs_diff=float(diff.max()), mismatch_fraction=mism)
    kl, vl = list(torch.zeros_like(kp)), list(torch.zeros_like(vp))
    kernels.context_kv_to_pool(kv, w, pos, loc, kl, vl, sh.rope_theta, sh.eps)
    same = all(torch.equal(kl[i], kp[i]) and torch.equal(vl[i], vp[i]) for i in range(sh.draft_layers))
    record("context_kv per-layer pools == 4d pool", same)

    # reference vs DFlashDrafter.context_kv (bit-exact on identical projections).
    drafter = tiny_drafter_for_check(sh, device, dtype)
    cfg = drafter.cfg
    taps = torch.randn(6, cfg.num_taps * cfg.hidden_size, generator=g, device=device).to(dtype)
    tpos = torch.randint(0, 32768, (6,), generator=g, device=device)
    with torch.no_grad():
        want_k, want_v = drafter.context_kv(taps, tpos)
        c = drafter.fuse_context(taps)
        per = [t for layer in drafter.layers for t in (layer.self_attn.k_proj(c), layer.self_attn.v_proj(c))]
        kvd = torch.stack(per, 1).view(6, cfg.num_hidden_layers, 2, cfg.num_key_value_heads, -1)
        k_norm_w = ref.stacked_kv_weights(drafter)[2]
        k, v = ref.context_k_v_ref(kvd, k_norm_w, tpos, cfg.rope_theta, cfg.rms_norm_eps)
    ok = all(torch.equal(k[:, i], want_k[i]) and torch.equal(v[:, i], want_v[i]) for i in range(len(want_k)))
    record("context_kv reference == drafter.context_kv (bit-exact)", ok)

    # greedy accept
    for bs in sorted({1, max(sh.batches)}):
        block, ids, valid = greedy_inputs(bs, sh, device, g)
        for ragged in (False, True):
            vlen = valid if ragged else None
            got, want = kernels.greedy_accept(block, ids, vlen), ref.greedy_accept_ref(block, ids, vlen)
            record(f"greedy_accept bs={bs} ragged={ragged}", same_result(got, want))
        logits = torch.randn(bs, sh.block, 97, generator=g, device=device)
        blk = torch.randint(0, 97, (bs, sh.block), generator=g, device=device)
        blk[:, 1:] = torch.where(torch.rand(bs, sh.block - 1, generator=g, device=device) < 0.8,
                                 logits.argmax(-1)[:, :-1], blk[:, 1:])
        record(f"greedy reference == core.greedy_verify bs={bs}",
               same_result(ref.greedy_accept_ref(blk, logits.argmax(-1)), greedy_verify(blk, logits)))

    # rejection sampling, bit for bit at the real vocabulary
    for bs in sorted({1, max(sh.batches)}):
        tokens, p, q, u, bu, valid = rejection_inputs(bs, sh.block, sh.vocab, device, g)
        for ragged in (False, True):
            vlen = valid if ragged else None
            got = kernels.chain_rejection(tokens, p, q, u, bu, vlen)
            want = ref.chain_rejection_ref(tokens, p, q, u, bu, vlen)
            record(f"chain_rejection bs={bs} V={sh.vocab} ragged={ragged} (bit-exact)",
                   same_result(got, want), mean_accept=float(got.accept_len.float().mean()))

    # chi-square: first committed token ~ p0 (kernel, many rows)
    ok, detail = chi_square_check(sh.chi2_rows, device, g)
    record("chain_rejection chi-square first token ~ p", ok, **detail)
    return out


def chi_square_check(rows: int, device: torch.device, g: torch.Generator) -> tuple[bool, dict[str, Any]]:
    p = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.00], device=device)
    q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30], device=device)
    p2 = torch.stack([p, p.flip(0)]).expand(rows, 2, 6)
    d = torch.multinomial(q, rows, replacement=True, generator=g).view(rows, 1)
    tokens = torch.cat([torch.zeros_like(d), d], dim=1)
    u = torch.rand(rows, 1, generator=g, device=device)
    bu = torch.rand(rows, generator=g, device=device)
    res = kernels.chain_rejection(tokens, p2, q.expand(rows, 1, 6), u, bu, block_v=16)
    counts = torch.bincount(res.committed[:, 0], minlength=6).double().cpu()
    expect = (p.double() * rows).cpu()
    keep = expect > 0
    stat = float(((counts[keep] - expect[keep]) ** 2 / expect[keep]).sum())
    dof = int(keep.sum()) - 1
    pval = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))  # chi2 sf
    ok = pval > 1e-4 and float(counts[~keep].sum()) == 0
    return ok, {"rows": rows, "chi2": stat, "p_value": pval, "counts": counts.tolist()}


def tiny_drafter_for_check(sh: Shapes, device: torch.device, dtype: torch.dtype) -> DFlashDrafter:
    cfg = drafter_config(Shapes(**{**asdict(TINY), "head_dim": sh.head_dim, "kv_heads": 2, "heads": 4}))
    torch.manual_seed(1)
    with torch.device(device):
        m = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, prm in m.named_parameters():
            if name.endswith("norm.weight"):
                prm.copy_(1 + 0.2 * torch.randn_like(prm))
    return m.to(dtype).eval()


# ---------------------------------------------------------------------------------------------------
# 2. kernel timings
# ---------------------------------------------------------------------------------------------------
def bench_kernels(sh: Shapes, device: torch.device, dtype: torch.dtype, clock: Clock,
                  peak_bps: float) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(1)
    rows: list[dict[str, Any]] = []
    es = torch.finfo(dtype).bits // 8

    def add(name: str, shape: str, nbytes: int, kern: Callable[[], Any], refn: Callable[[], Any]) -> None:
        tk = clock.time(kern, flush=True)
        tr = clock.time(refn, flush=True)
        roof_ms = nbytes / peak_bps * 1e3
        km, rm = tk["median_ms"], tr["median_ms"]
        rows.append({
            "kernel": name, "shape": shape, "bytes": nbytes, "kernel_ms": km, "ref_ms": rm,
            "speedup_vs_ref": rm / km, "roofline_ms": roof_ms,
            "achieved_tbs": nbytes / (km * 1e-3) / 1e12, "frac_of_peak_bw": roof_ms / km,
        })

    for n in sh.ctx_kv_tokens:
        kv, w, pos, loc, kp, vp = ctx_kv_inputs(n, sh, device, dtype, g)
        nbytes = 2 * kv.numel() * es + n * 16 + w.numel() * es
        add("context_kv_to_pool", f"N={n} L={sh.draft_layers} kvh={sh.kv_heads} d={sh.head_dim}", nbytes,
            lambda kv=kv, w=w, pos=pos, loc=loc, kp=kp, vp=vp: kernels.context_kv_to_pool(
                kv, w, pos, loc, kp, vp, sh.rope_theta, sh.eps),
            lambda kv=kv, w=w, pos=pos, loc=loc, kp=kp, vp=vp: ref.context_kv_to_pool_ref(
                kv, w, pos, loc, kp, vp, sh.rope_theta, sh.eps))
    for bs in sh.batches:
        block, ids, valid = greedy_inputs(bs, sh, device, g)
        nbytes = bs * sh.block * (8 + 8 + 8) + bs * (8 + 8 + 8)
        add("greedy_accept", f"bs={bs} B={sh.block} ragged", nbytes,
            lambda b=block, i=ids, v=valid: kernels.greedy_accept(b, i, v),
            lambda b=block, i=ids, v=valid: ref.greedy_accept_ref(b, i, v))
    for bs in sh.batches:
        tokens, p, q, u, bu, _ = rejection_inputs(bs, sh.block, sh.vocab, device, g)
        nbytes = bs * sh.vocab * 8 + bs * sh.block * 8 * 4  # one p row + one q row per request, gathers
        add("chain_rejection", f"bs={bs} B={sh.block} V={sh.vocab}", nbytes,
            lambda t=tokens, p=p, q=q, u=u, bu=bu: kernels.chain_rejection(t, p, q, u, bu),
            lambda t=tokens, p=p, q=q, u=u, bu=bu: ref.chain_rejection_ref(t, p, q, u, bu))
    return rows


# ---------------------------------------------------------------------------------------------------
# 3. models: a compact dense Qwen3-like target and our drafter
# ---------------------------------------------------------------------------------------------------
def drafter_config(sh: Shapes) -> DFlashConfig:
    return DFlashConfig.from_dict({
        "architectures": ["DFlashDraftModel"], "hidden_size": sh.hidden, "intermediate_size": sh.inter,
        "num_hidden_layers": sh.draft_layers, "num_attention_heads": sh.heads,
        "num_key_value_heads": sh.kv_heads, "head_dim": sh.head_dim, "rms_norm_eps": sh.eps,
        "rope_theta": sh.rope_theta, "vocab_size": sh.vocab, "block_size": sh.block,
        "num_target_layers": sh.target_layers,
        "dflash_config": {"target_layer_ids": list(sh.taps), "mask_token_id": sh.vocab - 1},
    })


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return ref.rms_norm(x, w, eps)


class DenseTarget:
    """Qwen3-style decoder (q/k norm, GQA, SwiGLU) with a per-request dense KV cache; random weights."""

    def __init__(self, sh: Shapes, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        self.sh = sh
        g = torch.Generator(device=device).manual_seed(seed)
        h, d = sh.hidden, sh.head_dim

        def lin(o: int, i: int) -> torch.Tensor:
            return (torch.randn(o, i, generator=g, device=device, dtype=dtype) * i**-0.5)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=device, dtype=dtype)

        self.embed = torch.randn(sh.vocab, h, generator=g, device=device, dtype=dtype)
        self.layers = [
            dict(ln1=ones(h), qkv=lin((sh.heads + 2 * sh.kv_heads) * d, h), qn=ones(d), kn=ones(d),
                 o=lin(h, sh.heads * d), ln2=ones(h), gu=lin(2 * sh.inter, h), down=lin(h, sh.inter))
            for _ in range(sh.target_layers)
        ]
        self.norm = ones(h)
        self.lm_head = lin(sh.vocab, h)

    def new_cache(self, bs: int, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
        sh = self.sh
        shape = (sh.target_layers, bs, cap, sh.kv_heads, sh.head_dim)
        return (torch.zeros(shape, device=self.embed.device, dtype=self.embed.dtype),
                torch.zeros(shape, device=self.embed.device, dtype=self.embed.dtype))

    @torch.no_grad()
    def verify(self, tokens: torch.Tensor, ctx: int, cache: tuple[torch.Tensor, torch.Tensor],
               mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [bs, B] at positions ctx..ctx+B-1 -> logits [bs, B, V], taps [bs, B, T*H].

        Writes the block's K/V into the cache. mask [g*B, ctx+B] bool (queries grouped per kv head).
        """
        sh = self.sh
        bs, nb = tokens.shape
        grp = sh.heads // sh.kv_heads
        x = self.embed[tokens]
        pos = torch.arange(ctx, ctx + nb, device=tokens.device).expand(bs, nb)
        cos, sin = rope_cos_sin(pos, sh.head_dim, sh.rope_theta, x.dtype)
        taps = []
        for i, lw in enumerate(self.layers):
            qkv = F.linear(_rms(x, lw["ln1"], sh.eps), lw["qkv"]).view(bs, nb, sh.heads + 2 * sh.kv_heads, -1)
            q, k, v = qkv.split([sh.heads, sh.kv_heads, sh.kv_heads], dim=2)
            q = apply_rope(_rms(q, lw["qn"], sh.eps), cos, sin)
            k = apply_rope(_rms(k, lw["kn"], sh.eps), cos, sin)
            cache[0][i, :, ctx:ctx + nb] = k
            cache[1][i, :, ctx:ctx + nb] = v
            kk = cache[0][i, :, :ctx + nb].transpose(1, 2)  # [bs, kvh, S, d]
            vv = cache[1][i, :, :ctx + nb].transpose(1, 2)
            # GQA without repeating K/V: fold each kv head's query group into the query axis.
            qg = q.view(bs, nb, sh.kv_heads, grp, -1).permute(0, 2, 3, 1, 4)
            qg = qg.reshape(bs, sh.kv_heads, grp * nb, -1)
            a = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=mask)
            a = a.view(bs, sh.kv_heads, grp, nb, -1).permute(0, 3, 1, 2, 4).reshape(bs, nb, -1)
            x = x + F.linear(a, lw["o"])
            gate, up = F.linear(_rms(x, lw["ln2"], sh.eps), lw["gu"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, lw["down"])
            if i in sh.taps:
                taps.append(x)
        logits = F.linear(_rms(x, self.norm, sh.eps), self.lm_head)
        return logits, torch.cat(taps, dim=-1)


def grouped_block_mask(ctx: int, nb: int, grp: int, device: torch.device) -> torch.Tensor:
    """[grp*nb, ctx+nb] bool: every query sees the context and the block causally."""
    qi = torch.arange(nb, device=device).repeat(grp)[:, None]
    kj = torch.arange(ctx + nb, device=device)[None, :]
    return kj <= ctx + qi


def build_drafter(sh: Shapes, device: torch.device, dtype: torch.dtype) -> DFlashDrafter:
    torch.manual_seed(2)
    with torch.device(device):
        m = DFlashDrafter(drafter_config(sh))
    return m.to(dtype).eval()


class Step:
    """Static buffers + the eager step function for one of (target verify, draft) at one batch size."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.graph: Any = None
        self.graph_error: str | None = None

    def capture(self, device: torch.device) -> None:
        if device.type != "cuda":
            self.graph_error = "no CUDA"
            return
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.fn()
            torch.cuda.synchronize()
            self.graph = g
        except Exception as e:  # noqa: BLE001 - record and fall back to eager
            self.graph_error = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.synchronize()

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()


def make_steps(sh: Shapes, bs: int, target: DenseTarget, drafter: DFlashDrafter, stacked,
               device: torch.device) -> tuple[Step, Step, dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(bs)
    cfg = drafter.cfg
    nb, ctx = sh.block, sh.ctx
    cache = target.new_cache(bs, ctx + nb)
    mask = grouped_block_mask(ctx, nb, sh.heads // sh.kv_heads, device)
    v_tokens = torch.randint(0, sh.vocab, (bs, nb), generator=g, device=device)

    def verify_step():
        logits, taps = target.verify(v_tokens, ctx, cache, mask)
        return kernels.greedy_accept(v_tokens, logits.argmax(-1)), taps

    # Drafter inputs are their own static buffers: the draft of an independent micro-batch.
    cap = ctx + nb
    pool_k = torch.zeros(cfg.num_hidden_layers, bs * cap, cfg.num_key_value_heads, cfg.head_dim,
                         device=device, dtype=target.embed.dtype)
    pool_v = torch.zeros_like(pool_k)
    d_taps = torch.randn(bs * nb, cfg.num_taps * cfg.hidden_size, generator=g, device=device).to(pool_k.dtype)
    inj_pos = (ctx - nb + torch.arange(nb, device=device)).repeat(bs)  # the block's tokens become context
    inj_loc = torch.arange(bs, device=device)[:, None] * cap + (ctx - nb) + torch.arange(nb, device=device)
    inj_loc = inj_loc.view(-1)
    d_block = torch.randint(0, sh.vocab, (bs, nb), generator=g, device=device)
    d_block[:, 1:] = cfg.mask_token_id
    d_pos = torch.arange(ctx, ctx + nb, device=device).expand(bs, nb)
    ctx_pos = torch.arange(ctx, device=device).expand(bs, ctx)
    view = ContextKV(
        keys=[pool_k[i].view(bs, cap, *pool_k.shape[2:])[:, :ctx] for i in range(cfg.num_hidden_layers)],
        values=[pool_v[i].view(bs, cap, *pool_v.shape[2:])[:, :ctx] for i in range(cfg.num_hidden_layers)],
        positions=ctx_pos, valid=torch.ones(bs, ctx, dtype=torch.bool, device=device))

    @torch.no_grad()
    def draft_step():
        kernels.drafter_context_kv_to_pool(drafter, d_taps, inj_pos, inj_loc, pool_k, pool_v, stacked)
        hidden = drafter.forward_block(target.embed[d_block], d_pos, view)
        return drafter.logits(hidden[:, 1:], target.lm_head).argmax(-1)

    verify_step()
    draft_step()
    shapes = {"bs": bs, "block": nb, "ctx": ctx}
    return Step(verify_step), Step(draft_step), shapes


def bench_models(sh: Shapes, device: torch.device, dtype: torch.dtype, clock: Clock, deadline: float,
                 result: dict[str, Any]) -> None:
    """Appends to result["latency"] / result["overlap"] per batch size (a failing size is recorded)."""
    t0 = time.time()
    target = DenseTarget(sh, device, dtype)
    drafter = build_drafter(sh, device, dtype)
    stacked = ref.stacked_kv_weights(drafter)
    result["notes"].append(f"models built in {time.time() - t0:.1f}s")
    for bs in sh.batches:
        if time.time() > deadline:
            result["notes"].append(f"models: skipped bs={bs} and later (time budget)")
            break
        try:
            verify, draft, shp = make_steps(sh, bs, target, drafter, stacked, device)
            row: dict[str, Any] = dict(shp)
            row["target_eager_ms"] = clock.time(verify.fn)["median_ms"]
            row["draft_eager_ms"] = clock.time(draft.fn)["median_ms"]
            verify.capture(device)
            draft.capture(device)
            row["graph_errors"] = [e for e in (verify.graph_error, draft.graph_error) if e and e != "no CUDA"]
            if verify.graph is not None:
                row["target_graph_ms"] = clock.time(verify.run)["median_ms"]
            if draft.graph is not None:
                row["draft_graph_ms"] = clock.time(draft.run)["median_ms"]
            tv = row.get("target_graph_ms", row["target_eager_ms"])
            td = row.get("draft_graph_ms", row["draft_eager_ms"])
            row["draft_over_target"] = td / tv
            result["latency"].append(row)
            result["overlap"].append(measure_overlap(verify, draft, clock, device, shp, tv, td))
            del verify, draft
        except Exception as e:  # noqa: BLE001 - keep the other batch sizes
            result["errors"].append({"section": f"models bs={bs}", "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc()[-3000:]})
            print(f"!! models bs={bs} failed: {type(e).__name__}: {e}", flush=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def measure_overlap(verify: Step, draft: Step, clock: Clock, device: torch.device, shp: dict[str, Any],
                    tv: float, td: float) -> dict[str, Any]:
    """Serial (one stream) vs drafter on a side stream, ordered by events, next to the target."""
    cuda = device.type == "cuda"
    main = torch.cuda.current_stream() if cuda else None
    side = torch.cuda.Stream() if cuda else None

    def serial() -> None:
        verify.run()
        draft.run()

    def overlapped() -> None:
        if not cuda:
            return serial()
        ready = torch.cuda.Event()
        ready.record(main)  # drafter inputs are ready (in the worker: taps of step t written)
        side.wait_event(ready)
        with torch.cuda.stream(side):
            draft.run()
            done = torch.cuda.Event()
            done.record(side)
        verify.run()
        main.wait_event(done)  # the next host read / sampler waits for both

    ts = clock.time(serial)["median_ms"]
    to = clock.time(overlapped)["median_ms"]
    return {**shp, "scenario": "independent micro-batches: draft(A) on side stream || verify(B) on main",
            "graphs": verify.graph is not None and draft.graph is not None, "target_ms": tv,
            "draft_ms": td, "serial_ms": ts, "two_stream_ms": to, "saved_ms": ts - to,
            "speedup": ts / to, "hidden_fraction_of_draft": (ts - to) / td if td > 0 else 0.0}


# ---------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def meta(device: torch.device, args: argparse.Namespace, sh: Shapes) -> dict[str, Any]:
    cuda = device.type == "cuda"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),  # noqa: UP017 (py3.10)
        "dry_run": bool(args.dry_run),
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.machine()})",
        "gpu_name": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "peak_bw_tbs": args.peak_bw_tbs,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"), "shapes": asdict(sh),
        "args": vars(args),
    }


DEFINITIONS = {
    "target_*_ms": "target verify of one block per request: embed, all layers (block K/V written into the "
                   "cache, attention over ctx + block), final norm, LM head on all B positions, argmax, "
                   "greedy_accept kernel",
    "draft_*_ms": "draft step: context-KV injection of B tokens per request (fc + hidden_norm + stacked k/v "
                  "GEMM + context_kv_to_pool kernel), drafter forward_block over ctx + block, LM head on "
                  "B-1 positions, argmax",
    "kernels.bytes": "minimum HBM traffic of the kernel's contract; roofline_ms = bytes / peak_bw",
    "overlap": "two independent micro-batches; serial = verify then draft on one stream, two_stream = "
               "draft on a side stream (event-ordered) concurrently with verify",
}


def main(args: argparse.Namespace) -> int:
    start = time.time()
    deadline = start + args.time_budget_s
    if args.dry_run:
        device, dtype = torch.device("cpu"), torch.bfloat16
        warmup, iters = 0 if args.warmup is None else args.warmup, 1 if args.iters is None else args.iters
        torch.set_num_threads(min(2, torch.get_num_threads()))
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; use --dry-run on CPU", file=sys.stderr)
            return 2
        device, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
        warmup = 5 if args.warmup is None else args.warmup
        iters = 20 if args.iters is None else max(args.iters, 1)
    sh = shapes_from_args(args)
    clock = Clock(device, warmup, iters)
    result: dict[str, Any] = {"meta": meta(device, args, sh), "correctness": [], "kernels": [], "latency": [],
                              "overlap": [], "errors": [], "notes": [], "definitions": DEFINITIONS}

    def section(name: str, fn: Callable[[], Any]) -> Any:
        if time.time() > deadline:
            result["notes"].append(f"{name}: skipped (time budget {args.time_budget_s:.0f}s)")
            return None
        t = time.time()
        print(f"== {name}", flush=True)
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - keep going, report at the end
            result["errors"].append({"section": name, "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc()[-3000:]})
            print(f"!! {name} failed: {type(e).__name__}: {e}", flush=True)
            return None
        finally:
            result["notes"].append(f"{name}: {time.time() - t:.1f}s")

    checks = section("correctness", lambda: check_kernels(sh, device, dtype)) or []
    result["correctness"] = checks
    print(table(checks, ["name", "ok", "max_abs_diff", "mismatch_fraction", "p_value", "mean_accept"]))
    bench = section("kernels", lambda: bench_kernels(sh, device, dtype, clock, args.peak_bw_tbs * 1e12)) or []
    result["kernels"] = bench
    print(table(bench, ["kernel", "shape", "kernel_ms", "ref_ms", "speedup_vs_ref", "roofline_ms",
                        "achieved_tbs", "frac_of_peak_bw"]))
    if not args.skip_models:
        section("models", lambda: bench_models(sh, device, dtype, clock, deadline, result))
        print(table(result["latency"], ["bs", "block", "ctx", "target_eager_ms", "target_graph_ms",
                                        "draft_eager_ms", "draft_graph_ms", "draft_over_target"]))
        print(table(result["overlap"], ["bs", "graphs", "target_ms", "draft_ms", "serial_ms", "two_stream_ms",
                                        "saved_ms", "speedup", "hidden_fraction_of_draft"]))
    result["sglang_imported"] = any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)
    failed = [c["name"] for c in checks if not c["ok"]]
    result["ok"] = not failed and not result["errors"] and not result["sglang_imported"] and bool(checks)
    result["elapsed_s"] = time.time() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    if args.dry_run:
        print("gpu_check: DRY RUN on CPU (tiny shapes, Triton interpreter): timings above mean nothing")
    print(f"gpu_check: {'OK' if result['ok'] else 'FAILED'} in {result['elapsed_s']:.0f}s "
          f"({len(failed)} failed checks, {len(result['errors'])} errors) -> {out}")
    if failed:
        print("failed checks: " + "; ".join(failed))
    return 0 if result["ok"] else 1


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    return str(o)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(ARGS))
