"""``dflash-sglang generate``: the reference engine on a prompts file, with stats and a lossless check."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from .core.drafter import DFlashDrafter
from .core.engine import EngineConfig, ReferenceEngine, RequestResult, autoregressive_generate
from .core.lookup import LookupConfig
from .core.sampling import SamplingConfig
from .core.target import HFTarget, load_hf_target
from .prompts import Prompt, chat_ids, eos_token_ids, first_per_category, load_prompts


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="DFlash reference engine on a prompts JSONL file")
    p.add_argument("--target", required=True, help="HF target model folder")
    p.add_argument("--draft", required=True, help="DFlash draft checkpoint folder")
    p.add_argument("--prompts", required=True, help="JSONL with prompt / question / turns")
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's block_size")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--sampling-mode", choices=["rejection", "target_only"], default="rejection")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--draft-head-dtype", choices=["auto", "target", "bfloat16"], default="auto",
                   help="LM-head dtype while drafting (auto: bf16 on CPUs with native bf16, else the "
                        "target's; always lossless)")
    p.add_argument("--full-draft-vocab", action="store_true",
                   help="draft over the whole vocabulary even if the drafter has a draft_vocab.json")
    p.add_argument("--predraft-fanout", type=int, default=0,
                   help="pre-draft block n+1 for the F likeliest outcomes of verify(n) (issue #20; 0: off)")
    p.add_argument("--predraft-thread", action="store_true",
                   help="run the pre-draft on a second thread while the target verifies")
    p.add_argument("--lookup", choices=["on", "off"], default="on",
                   help="context lookup drafts (core.lookup): where the newest tokens occurred before in the "
                        "prompt or output, draft what followed them (default on, as the server; lossless)")
    p.add_argument("--lookup-ngram", type=int, nargs=2, default=(1, 4), metavar=("MIN", "MAX"),
                   help="suffix lengths the lookup tries, longest first (default 1 4)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--per-category", type=int, default=None,
                   help="first N prompts of every category (applied before --limit)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--check-lossless", action="store_true",
                   help="also decode plainly (greedy) and exit 1 on any token difference")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding timing run")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object of stats")
    p.set_defaults(func=run_generate)


@dataclass
class Setup:
    engine: ReferenceEngine
    target: HFTarget
    tokenizer: Any
    eos: tuple[int, ...]


def load_pair(draft: str, target_path: str) -> tuple[DFlashDrafter, Any, Any, HFTarget]:
    """A drafter and its HF target, ready for the reference engine: (drafter, model, tokenizer, target
    tapped at the drafter's layers). The one loader of the CLI and the benchmark scripts."""
    drafter = DFlashDrafter.from_pretrained(draft)
    model, tok = load_hf_target(target_path)
    drafter = _with_mask(drafter, tok)
    return drafter, model, tok, HFTarget(model, drafter.cfg.target_layer_ids)


def build(args: argparse.Namespace) -> Setup:
    drafter, model, tok, target = load_pair(args.draft, args.target)
    block = args.block_size or drafter.cfg.block_size
    if block > drafter.cfg.block_size:
        print(f"warning: --block-size {block} exceeds the drafter's trained block_size "
              f"{drafter.cfg.block_size}; acceptance will suffer", file=sys.stderr)
    eos = eos_token_ids(model, tok)
    head_dtype = {"auto": None, "target": model.dtype, "bfloat16": torch.bfloat16}[args.draft_head_dtype]
    if args.full_draft_vocab:
        drafter.draft_vocab = None
    lookup = LookupConfig(*args.lookup_ngram) if args.lookup == "on" else None
    cfg = EngineConfig(block, args.max_new_tokens, eos, args.sampling_mode, head_dtype,
                       predraft_fanout=args.predraft_fanout, predraft_thread=args.predraft_thread,
                       lookup=lookup)
    return Setup(ReferenceEngine(target, drafter, cfg), target, tok, eos)


def _with_mask(drafter: DFlashDrafter, tok: Any) -> DFlashDrafter:
    drafter.cfg = drafter.cfg.with_tokenizer(tok)  # resolves a string mask_token; else unchanged
    return drafter


def _batches(n: int, size: int) -> list[range]:
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


def run_generate(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    s = build(args)
    prompts = load_prompts(args.prompts, None if args.per_category else args.limit)
    if args.per_category:
        prompts = first_per_category(prompts, args.per_category)[: args.limit]
    ids = [chat_ids(s.tokenizer, p.text) for p in prompts]
    gen = torch.Generator().manual_seed(args.seed)
    spec: list[RequestResult] = []
    t0 = time.perf_counter()
    for r in _batches(len(ids), args.batch_size):
        sampling = SamplingConfig.uniform(len(r), args.temperature, args.top_k, args.top_p)
        spec.extend(s.engine.generate([ids[i] for i in r], sampling, gen))
    spec_time = time.perf_counter() - t0
    base, base_time = None, None
    if args.check_lossless or not args.no_baseline:
        base, base_time = _baseline(s, ids, args)
    stats = summarize(prompts, spec, spec_time, base, base_time, s.engine.cfg.block_size, args)
    if s.engine.predrafter is not None:
        stats["predraft"] = {**s.engine.predrafter.stats.to_dict(), "where": s.engine.predrafter.where}
    if s.engine.cfg.lookup is not None:
        stats["lookup"] = {**s.engine.lookup_stats.to_dict(), "min_ngram": s.engine.cfg.lookup.min_ngram,
                           "max_ngram": s.engine.cfg.lookup.max_ngram}
    if not args.json:
        for p, r in zip(prompts[:3], spec, strict=False):
            print(f"--- {p.text[:70]!r}\n{s.tokenizer.decode(r.output_ids)}\n")
        print(_human(stats))
    print(json.dumps(stats))
    return 1 if args.check_lossless and not stats["identical"] else 0


def _baseline(s: Setup, ids: list[list[int]], args: argparse.Namespace) -> tuple[list[list[int]], float]:
    gen = torch.Generator().manual_seed(args.seed)
    temperature = 0.0 if args.check_lossless else args.temperature
    out: list[list[int]] = []
    t0 = time.perf_counter()
    for r in _batches(len(ids), args.batch_size):
        sampling = SamplingConfig.uniform(len(r), temperature, args.top_k, args.top_p)
        out.extend(autoregressive_generate(s.target, [ids[i] for i in r], args.max_new_tokens, s.eos,
                                           sampling, gen))
    return out, time.perf_counter() - t0


def summarize(prompts: list[Prompt], spec: list[RequestResult], spec_time: float,
              base: list[list[int]] | None, base_time: float | None, block: int,
              args: argparse.Namespace) -> dict[str, Any]:
    tokens = sum(len(r.output_ids) for r in spec)
    steps = sum(r.steps for r in spec)
    committed = sum(sum(r.committed_per_step) for r in spec)
    accept_hist = [0] * max(block - 1, 0)  # [j]: steps whose draft position j+1 was accepted
    len_hist = [0] * block  # [k]: steps committing exactly k+1 tokens
    by_cat: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p, r in zip(prompts, spec, strict=True):
        for k in r.committed_per_step:
            len_hist[k - 1] += 1
            for j in range(k - 1):
                accept_hist[j] += 1
        by_cat[p.category][0] += sum(r.committed_per_step)
        by_cat[p.category][1] += r.steps
    base_tokens = sum(len(b) for b in base) if base is not None else None
    stats: dict[str, Any] = {
        "prompts": len(prompts),
        "block_size": block,
        "batch_size": args.batch_size,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "tokens": tokens,
        "steps": steps,
        "tau": committed / steps if steps else 0.0,
        "accept_hist": accept_hist,
        "accept_len_hist": len_hist,
        "tau_by_category": {c: v[0] / v[1] for c, v in sorted(by_cat.items()) if v[1]},
        "spec_time_s": spec_time,
        "spec_tok_s": tokens / spec_time,
        "ar_time_s": base_time,
        "ar_tok_s": base_tokens / base_time if base_time else None,
        "speedup": (tokens / spec_time) / (base_tokens / base_time) if base_time and base_tokens else None,
        "threads": torch.get_num_threads(),
    }
    if args.check_lossless and base is not None:
        diffs = [i for i, (a, b) in enumerate(zip(spec, base, strict=True)) if a.output_ids != b]
        stats["identical"] = not diffs
        stats["mismatched_prompts"] = diffs
    return stats


def _human(s: dict[str, Any]) -> str:
    sp = f"{s['speedup']:.2f}x" if s["speedup"] else "n/a"
    lines = [f"tau (tokens per verify step) = {s['tau']:.2f}   speedup vs plain decoding = {sp}",
             f"spec {s['spec_tok_s']:.1f} tok/s   plain {s['ar_tok_s'] or 0:.1f} tok/s   "
             f"{s['tokens']} tokens in {s['steps']} steps"]
    if "identical" in s:
        lines.append("lossless: " + ("identical to plain greedy" if s["identical"] else
                                     f"MISMATCH on prompts {s['mismatched_prompts']}"))
    return "\n".join(lines)
