"""``dflash-sglang train``: train a DFlash drafter for a target, from a distill store or from prompts.

Data comes either from a distill store (``--store``: the target's answers as token ids, see
``dflash-sglang distill``; tap features from the store's cache, rebuilt by a batched prefill where
missing) or from prompt files (``--data``: answered here and cached, the original pipeline).
The optimisation flags are generated from :class:`TrainConfig`'s fields, so names, types and
defaults live in one place.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
import typing
from dataclasses import fields
from pathlib import Path

import torch

from ..core.config import DFlashConfig, DFlashConfigError, TargetSpec
from ..settings import settings
from .grow import grow_layers
from .loop import TrainConfig, copy_top_layers, init_distributed, init_from_target, rank_device, train


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a DFlash drafter for a target (self-distillation)")
    p.add_argument("--target", required=True, help="HF target model folder")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", nargs="+", help="JSONL prompt files (prompt/question/turns), answered here")
    src.add_argument("--store", help="a distill store folder (dflash-sglang distill): train on its answers")
    p.add_argument("--out", required=True, help="output folder: published DFlash checkpoint")
    p.add_argument("--state-dir", default=None, help="resumable train state + logs (default: --out)")
    g = p.add_argument_group("data")
    g.add_argument("--num-prompts", type=int, default=1000,
                   help="--data: training prompts (first N rows); --store: at most N stored answers "
                        "(0: all)")
    g.add_argument("--eval-prompts", type=int, default=4,
                   help="held-out prompts for tau: --data: the rows after the first N; --store: the first "
                        "rows of --eval-data")
    g.add_argument("--eval-data", default=None, help="--store: held-out prompt file (.jsonl or .jsonl.gz)")
    g.add_argument("--eval-store", default=None,
                   help="a distill store of held-out prompts: teacher-forced acceptance at each evaluation")
    g.add_argument("--max-answer-tokens", type=int, default=160)
    g.add_argument("--gen-batch-size", type=int, default=32)
    g.add_argument("--features", choices=["cache", "online"], default="cache",
                   help="cache: store bf16 tap features while answering; online: recompute per step")
    g.add_argument("--cache-dir", default=None, help="default: $DFLASH_SGLANG_CACHE/train-data")
    g.add_argument("--gen-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the target while it answers (--data only)")
    m = p.add_argument_group("drafter")
    m.add_argument("--init-from", default=None,
                   help="warm start: a DFlash checkpoint folder for this target; its config.json defines "
                        "the drafter (drafter flags given with it must agree). A train_state.pt in "
                        "--state-dir still wins (resume)")
    m.add_argument("--init-layers", choices=("random", "target-top"), default="random",
                   help="a new drafter's layers: random, or copies of the target's top layers (with fc "
                        "starting as the pick of the tap below them; train.loop.copy_top_layers)")
    m.add_argument("--grow-layers", type=int, default=0,
                   help="with --init-from: add N draft layers on top that start as the identity (their "
                        "o_proj/down_proj zero, so step 0 drafts exactly as the checkpoint; train.grow)")
    m.add_argument("--block-size", type=int, default=None, help="default 16")
    m.add_argument("--layers", type=int, default=None, help="default 1")
    m.add_argument("--taps", type=int, default=None,
                   help="number of tap layers (default: drafter_config_for)")
    m.add_argument("--intermediate-size", type=int, default=None)
    m.add_argument("--mask-token-id", type=int, default=None, help="default: the tokenizer's unk/eos id")
    m.add_argument("--draft-vocab", type=int, default=None,
                   help="draft vocabulary (what the drafter may propose when serving): the N most frequent "
                        "answer tokens (0: the whole vocabulary; default: the --init-from checkpoint's, else "
                        "the whole vocabulary)")
    m.add_argument("--train-vocab", type=int, default=0,
                   help="softmax of the loss over the N most frequent answer tokens plus the batch's labels "
                        "(a sampled softmax; 0: over the draft vocabulary, exact)")
    o = p.add_argument_group("optimisation (TrainConfig)")
    for f in fields(TrainConfig):
        if f.metadata.get("cli"):
            _add_config_flag(o, f)
    o.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    o.add_argument("--no-resume", action="store_true", help="ignore an existing train_state.pt")
    p.set_defaults(func=run_train)


def _add_config_flag(group: argparse._ArgumentGroup, f: typing.Any) -> None:
    hints = typing.get_type_hints(TrainConfig)
    typ = hints[f.name]
    if isinstance(typ, types.UnionType):  # "float | None" -> float
        typ = next(t for t in typing.get_args(typ) if t is not type(None))
    kw: dict[str, typing.Any] = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {}
    if typ is bool:
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw["type"] = typ
    group.add_argument(f"--{f.name.replace('_', '-')}", default=f.default,
                       help=f"{f.metadata['help']} (default {f.default})", **kw)


def config_from_args(a: argparse.Namespace) -> TrainConfig:
    opts = {f.name: getattr(a, f.name) for f in fields(TrainConfig) if f.metadata.get("cli")}
    return TrainConfig(out=a.out, state_dir=a.state_dir, resume=not a.no_resume, **opts)


def run_train(a: argparse.Namespace) -> int:
    from ..core.drafter import DFlashDrafter, load_safetensors_dir
    from ..core.random_drafter import drafter_config_for, random_drafter
    from ..core.target import HFTarget, load_hf_target
    from ..prompts import chat_ids, eos_token_ids

    if a.prompt_anchors and not a.store:
        raise SystemExit("--prompt-anchors labels prompts of a distill store: give --store")
    if a.grow_layers and not a.init_from:
        raise SystemExit("--grow-layers grows a trained drafter: give --init-from (--layers: a new one)")
    if a.threads:
        torch.set_num_threads(a.threads)
    d = init_distributed(a.device)
    dev = rank_device(a.device, d)
    model, tok = load_hf_target(a.target, device=dev)
    mask = a.mask_token_id
    if mask is None:
        mask = int(tok.unk_token_id if tok.unk_token_id is not None else tok.eos_token_id)
    if a.init_from:
        dcfg = warm_start_config(a, TargetSpec.from_hf_config(model.config))
    else:
        dcfg = drafter_config_for(model.config, a.layers or 1, a.block_size or 16, mask, a.taps,
                                  a.intermediate_size)
    target = HFTarget(model, dcfg.target_layer_ids)
    eos = eos_token_ids(model, tok)
    t0 = time.perf_counter()
    if a.store:
        samples, eval_p = _store_data(a, target, lambda t: chat_ids(tok, t), d.main)
    else:
        samples, eval_p = _prompt_data(a, target, lambda t: chat_ids(tok, t), eos, dcfg, dev, d)
    _log(d.main, f"data: {len(samples)} sequences, {sum(len(x.ids) for x in samples)} tokens "
                 f"({time.perf_counter() - t0:.0f}s)")
    cfg = config_from_args(a)
    if a.init_from:  # built from the config warm_start_config validated, not a second read of it
        drafter = DFlashDrafter(dcfg)
        drafter.load_published_state(load_safetensors_dir(Path(a.init_from)))
        from ..core.draft_head import load_draft_vocab

        drafter.draft_vocab = load_draft_vocab(a.init_from)
        _log(d.main, f"warm start from {a.init_from}")
        if a.grow_layers:
            drafter = grow_layers(drafter, a.grow_layers, a.seed)
            _log(d.main, f"grown to {drafter.cfg.num_hidden_layers} draft layers (the new ones start as "
                         "the identity)")
    else:
        drafter = init_from_target(random_drafter(dcfg, a.seed), model)
        if a.init_layers == "target-top":
            _log(d.main, f"drafter layers start as target layers {copy_top_layers(drafter, model)}")
    if a.draft_vocab is not None:
        drafter.draft_vocab = _draft_vocab(a.draft_vocab, samples, model.config.vocab_size, eos, d.main)
    train_vocab = _draft_vocab(a.train_vocab, samples, model.config.vocab_size, eos, d.main) \
        if a.train_vocab else None
    eval_s = None
    if a.eval_store:
        from .distill_store import DistillStore

        held = DistillStore.open(a.eval_store)
        held.fill_taps(target)
        eval_s = held.training_samples(target.tap_layer_ids)
    t0 = time.perf_counter()
    res = train(cfg, drafter, target, samples, eval_p, eos, eval_s, train_vocab)
    last = {k: v for k, v in (res.taus[-1] if res.taus else {}).items() if isinstance(v, float)}
    _log(d.main, f"trained {res.step} steps in {time.perf_counter() - t0:.0f}s -> {a.out}"
                 + "".join(f"; held-out {k} {v:.3f}" for k, v in last.items()))
    if d.world > 1:
        torch.distributed.destroy_process_group()
    return 0


def _store_data(a: argparse.Namespace, target: typing.Any, tokenize: typing.Any, main: bool) -> tuple:
    """Samples from a distill store (tap cache filled where missing) and held-out prompt ids."""
    from ..prompts import load_prompts
    from .distill_store import DistillStore

    store = DistillStore.open(a.store)
    filled = store.fill_taps(target, log=lambda m: _log(main, m))
    if filled:
        _log(main, f"taps: {filled} shards rebuilt from the stored ids by batched prefill")
    if a.prompt_anchors and store.fill_prompt_greedy(target, log=lambda m: _log(main, m)):
        _log(main, "prompt labels: the target's greedy tokens after every prompt prefix, by batched prefill")
    samples = store.training_samples(target.tap_layer_ids)
    if a.num_prompts:
        samples = samples[: a.num_prompts]
    eval_p = []
    if a.eval_prompts:
        if not a.eval_data:
            raise SystemExit("--store needs --eval-data for --eval-prompts (or --eval-prompts 0)")
        eval_p = [tokenize(p.text) for p in load_prompts(a.eval_data, a.eval_prompts)]
    return samples, eval_p


def _prompt_data(a: argparse.Namespace, target: typing.Any, tokenize: typing.Any, eos: tuple[int, ...],
                 dcfg: DFlashConfig, dev: str, d: typing.Any) -> tuple:
    from ..core.target import HFTarget, load_hf_target
    from .data import GenSettings, build_dataset, cache_key, prompt_ids_from_files

    prompts = prompt_ids_from_files(a.data, tokenize, a.num_prompts + a.eval_prompts)
    train_p, eval_p = prompts[: a.num_prompts], prompts[a.num_prompts:]
    s = GenSettings(a.max_answer_tokens, a.gen_batch_size, eos, dcfg.target_layer_ids, a.features == "cache",
                    a.gen_dtype)
    cache = Path(a.cache_dir or settings().train_cache) / cache_key(a.target, a.data, s)
    answerer = target
    if a.gen_dtype != "float32":
        gen_model = load_hf_target(a.target, getattr(torch, a.gen_dtype), dev)[0]
        answerer = HFTarget(gen_model, dcfg.target_layer_ids)
    samples = build_dataset(answerer, train_p, cache, s, show=d.main, rank=d.rank, world=d.world)
    _log(d.main, f"data cache {cache}")
    return samples, eval_p


def _draft_vocab(size: int, samples: list, vocab_size: int, eos: tuple[int, ...],
                 main: bool) -> torch.Tensor | None:
    from .recipe import select_draft_vocab

    if size <= 0 or size >= vocab_size:
        return None
    ids, cover = select_draft_vocab([s.ids[s.prompt_len:] for s in samples], size, vocab_size, eos)
    _log(main, f"vocabulary subset: {len(ids)} of {vocab_size} tokens, covering {100 * cover:.2f}% of the "
               "training answers' tokens")
    return ids


def warm_start_config(a: argparse.Namespace, target: TargetSpec) -> DFlashConfig:
    """The ``--init-from`` checkpoint's config, checked against the target and any drafter flags given."""
    if a.grow_layers < 0:
        raise DFlashConfigError(f"--grow-layers {a.grow_layers}: must be >= 0")
    if a.init_layers != "random":
        raise DFlashConfigError(f"--init-layers {a.init_layers} starts a new drafter; --init-from "
                                f"{a.init_from} loads one: give one of them")
    cfg = DFlashConfig.from_pretrained(a.init_from)
    cfg.validate_against(target)
    given = {"--block-size": (a.block_size, cfg.block_size),
             "--layers": (a.layers, cfg.num_hidden_layers),
             "--taps": (a.taps, cfg.num_taps),
             "--intermediate-size": (a.intermediate_size, cfg.intermediate_size),
             "--mask-token-id": (a.mask_token_id, cfg.mask_token_id)}
    for flag, (want, have) in given.items():
        if want is not None and want != have:
            raise DFlashConfigError(f"{flag} {want} disagrees with --init-from {a.init_from} ({have}); "
                                    f"drop {flag} or pick a matching checkpoint")
    return cfg


def _log(main: bool, msg: str) -> None:
    if main:
        print(msg, file=sys.stderr, flush=True)
