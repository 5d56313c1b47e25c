"""``dflash-sglang train-corpus`` and ``dflash-sglang distill``: the training data subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_corpus_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-corpus", help="build the diverse training prompt corpus from non-evaluation "
                                            "sources (scripts/install_corpus_sources.sh installs them)")
    p.add_argument("--out", required=True, help="output folder (train/heldout .jsonl.gz + manifest.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gsm8k", default=None, help="GSM8K TRAIN jsonl (default: shared data gsm8k_train.jsonl)")

    def run(a: argparse.Namespace) -> int:
        from .corpus import build_corpus

        build_corpus(a.out, a.seed, a.gsm8k, log=lambda m: print(m, file=sys.stderr, flush=True))
        return 0

    p.set_defaults(func=run)


def add_distill_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill",
                       help="greedy target answers to corpus prompts, appended to a token-id store")
    p.add_argument("--target", required=True, help="HF target model folder")
    p.add_argument("--corpus", required=True, help="corpus .jsonl or .jsonl.gz (train rows are used)")
    p.add_argument("--out", required=True, help="store folder (created, or extended)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--shard-batches", type=int, default=4, help="generation batches per store shard")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of the stratified order")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the target's dtype")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.set_defaults(func=run_distill)


def run_distill(a: argparse.Namespace) -> int:
    import torch

    from ..core.target import HFTarget, load_hf_target
    from ..generate_cli import _eos_ids
    from ..prompts import chat_ids
    from .corpus import load_corpus
    from .data import GenSettings
    from .distill import distill_into, pending
    from .distill_store import DistillStore, target_meta

    if a.threads:
        torch.set_num_threads(a.threads)
    corpus = Path(a.corpus)
    if not corpus.is_file() and Path(f"{corpus}.gz").is_file():
        corpus = Path(f"{corpus}.gz")
    model, tok = load_hf_target(a.target, getattr(torch, a.dtype))
    eos = _eos_ids(model, tok)
    meta = target_meta(a.target, a.dtype, a.max_new_tokens, eos, model.config.vocab_size)
    store = DistillStore.create_or_open(a.out, meta)
    todo = pending(load_corpus(corpus), store.keys(), a.limit)
    log = lambda m: print(m, file=sys.stderr, flush=True)
    log(f"distill: {len(todo)} prompts to answer -> {a.out} ({store.stats()['sequences']} already stored)")
    target = HFTarget(model, (model.config.num_hidden_layers - 1,))  # answer_batch needs one tap; not stored
    s = GenSettings(a.max_new_tokens, a.batch_size, eos, target.tap_layer_ids, store_taps=False,
                    dtype=a.dtype)
    rep = distill_into(store, target, lambda t: chat_ids(tok, t), todo, s, a.shard_batches, log)
    log(f"distill: {rep.sequences} sequences, {rep.answer_tokens} answer tokens in {rep.seconds:.0f}s "
        f"({rep.tok_s:.1f} tok/s); store: {store.stats()}")
    return 0
