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
    p.add_argument("--batch-size", type=int, default=64, help="sequences decoded together (slots)")
    p.add_argument("--max-len", type=int, default=2048,
                   help="prompt + answer tokens per slot (longer prompts are skipped)")
    p.add_argument("--shard-rows", type=int, default=256, help="answers per store shard")
    p.add_argument("--taps", default="default",
                   help="comma-separated tap layer ids whose features to cache beside the store "
                        "('default': the drafter default for this target; 'none': ids only)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of the stratified order")
    p.add_argument("--split", default="train", choices=["train", "heldout"],
                   help="corpus rows to answer (heldout: an evaluation store, never trained on)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the target's dtype")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--stop-on-loop", type=int, default=0, metavar="W",
                   help="end an answer once a W-token window repeats within it (the target looping; "
                        "0: off). Answers stay exact greedy prefixes")
    p.set_defaults(func=run_distill)


def run_distill(a: argparse.Namespace) -> int:
    import torch

    from ..core.target import HFTarget, load_hf_target
    from ..prompts import chat_ids, eos_token_ids
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
    eos = eos_token_ids(model, tok)
    meta = target_meta(a.target, a.dtype, a.max_new_tokens, eos, model.config.vocab_size)
    store = DistillStore.create_or_open(a.out, meta)
    todo = pending(load_corpus(corpus), store.keys(), a.limit, a.split)
    log = lambda m: print(m, file=sys.stderr, flush=True)
    log(f"distill: {len(todo)} prompts to answer -> {a.out} ({store.stats()['sequences']} already stored)")
    taps = parse_taps(a.taps, model.config)
    # the HF fallback (answer_batch) captures through hooks and needs at least one tap
    target = HFTarget(model, taps or (model.config.num_hidden_layers - 1,))
    s = GenSettings(a.max_new_tokens, a.batch_size, eos, target.tap_layer_ids, store_taps=bool(taps),
                    dtype=a.dtype)
    rep = distill_into(store, target, lambda t: chat_ids(tok, t), todo, s, a.shard_rows, log, a.max_len,
                       a.stop_on_loop)
    log(f"distill: {rep.sequences} sequences, {rep.answer_tokens} answer tokens "
        f"(+{rep.prompt_tokens} prompt) "
        f"in {rep.seconds:.0f}s ({rep.tok_s:.1f} answer tok/s); store: {store.stats()}")
    return 0


def parse_taps(spec: str, hf_config: object) -> tuple[int, ...]:
    """'default' -> the default drafter's taps for this target; 'none' -> (); else '1,8,14'."""
    if spec == "none":
        return ()
    if spec == "default":
        from ..core.random_drafter import drafter_config_for

        return tuple(drafter_config_for(hf_config, 1, 16, 0).target_layer_ids)
    try:
        return tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise SystemExit(f"--taps {spec!r}: use 'default', 'none' or comma-separated layer ids") from None
