"""``dflash-sglang train``: self-distil data from the target, then train a DFlash drafter for it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ..core.config import DFlashConfig, DFlashConfigError, TargetSpec
from ..settings import settings
from .loop import TrainConfig, init_distributed, init_from_target, rank_device, train


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a DFlash drafter for a target (self-distillation)")
    p.add_argument("--target", required=True, help="HF target model folder")
    p.add_argument("--data", required=True, nargs="+", help="JSONL prompt files (prompt/question/turns)")
    p.add_argument("--out", required=True, help="output folder: published DFlash checkpoint")
    p.add_argument("--state-dir", default=None, help="resumable train state + logs (default: --out)")
    g = p.add_argument_group("data")
    g.add_argument("--num-prompts", type=int, default=1000, help="training prompts (first N rows)")
    g.add_argument("--eval-prompts", type=int, default=4, help="held-out prompts after the first N")
    g.add_argument("--max-answer-tokens", type=int, default=160)
    g.add_argument("--gen-batch-size", type=int, default=32)
    g.add_argument("--features", choices=["cache", "online"], default="cache",
                   help="cache: store bf16 tap features while answering; online: recompute per step")
    g.add_argument("--cache-dir", default=None, help="default: $DFLASH_SGLANG_CACHE/train-data")
    g.add_argument("--gen-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the target while it answers (bf16: 2-4x faster on CPU, answers may "
                        "differ from the fp32 target's in rare near-ties)")
    m = p.add_argument_group("drafter")
    m.add_argument("--init-from", default=None,
                   help="warm start: a DFlash checkpoint folder for this target; its config.json defines "
                        "the drafter (drafter flags given with it must agree). A train_state.pt in "
                        "--state-dir still wins (resume)")
    m.add_argument("--block-size", type=int, default=None, help="default 16")
    m.add_argument("--layers", type=int, default=None, help="default 1")
    m.add_argument("--taps", type=int, default=None,
                   help="number of tap layers (default: drafter_config_for)")
    m.add_argument("--intermediate-size", type=int, default=None)
    m.add_argument("--mask-token-id", type=int, default=None, help="default: the tokenizer's unk/eos id")
    o = p.add_argument_group("optimisation")
    for name, typ, default in (("steps", int, 1000), ("batch-size", int, 8), ("blocks-per-seq", int, 16),
                               ("lr", float, 6e-4), ("warmup", int, 50), ("weight-decay", float, 0.01),
                               ("grad-clip", float, 1.0), ("gamma", float, None), ("seed", int, 0),
                               ("eval-every", int, 0), ("eval-max-new-tokens", int, 48),
                               ("save-every", int, 100), ("log-every", int, 10)):
        o.add_argument(f"--{name}", type=typ, default=default)
    o.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    o.add_argument("--head-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="matmul dtype of the frozen LM head in the loss (bf16: ~2x faster on CPU)")
    o.add_argument("--device", default="cpu", help="cpu | cuda (one GPU per rank under torchrun)")
    o.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    o.add_argument("--no-resume", action="store_true", help="ignore an existing train_state.pt")
    p.set_defaults(func=run_train)


def run_train(a: argparse.Namespace) -> int:
    from ..core.drafter import DFlashDrafter, load_safetensors_dir
    from ..core.random_drafter import drafter_config_for, random_drafter
    from ..core.target import HFTarget, load_hf_target
    from ..generate_cli import _eos_ids
    from ..prompts import chat_ids
    from .data import GenSettings, build_dataset, cache_key, prompt_ids_from_files

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
    eos = _eos_ids(model, tok)
    prompts = prompt_ids_from_files(a.data, lambda t: chat_ids(tok, t), a.num_prompts + a.eval_prompts)
    train_p, eval_p = prompts[: a.num_prompts], prompts[a.num_prompts:]
    s = GenSettings(a.max_answer_tokens, a.gen_batch_size, eos, dcfg.target_layer_ids, a.features == "cache",
                    a.gen_dtype)
    root = Path(a.cache_dir or settings().train_cache)
    cache = root / cache_key(a.target, a.data, s)
    t0 = time.perf_counter()
    answerer = target
    if a.gen_dtype != "float32":
        gen_model = load_hf_target(a.target, getattr(torch, a.gen_dtype), dev)[0]
        answerer = HFTarget(gen_model, dcfg.target_layer_ids)
    samples = build_dataset(answerer, train_p, cache, s, show=d.main, rank=d.rank, world=d.world)
    _log(d.main, f"data: {len(samples)} sequences, {sum(len(x.ids) for x in samples)} tokens, "
                 f"cache {cache} ({time.perf_counter() - t0:.0f}s)")
    cfg = TrainConfig(out=a.out, state_dir=a.state_dir, steps=a.steps, batch_size=a.batch_size,
                      blocks_per_seq=a.blocks_per_seq,
                      lr=a.lr, warmup=a.warmup, weight_decay=a.weight_decay, grad_clip=a.grad_clip,
                      gamma=a.gamma, seed=a.seed, device=a.device, log_every=a.log_every,
                      eval_every=a.eval_every, eval_max_new_tokens=a.eval_max_new_tokens,
                      save_every=a.save_every, save_dtype=a.save_dtype, head_dtype=a.head_dtype,
                      resume=not a.no_resume)
    t0 = time.perf_counter()
    if a.init_from:  # built from the config warm_start_config validated, not a second read of it
        drafter = DFlashDrafter(dcfg)
        drafter.load_published_state(load_safetensors_dir(Path(a.init_from)))
        _log(d.main, f"warm start from {a.init_from}")
    else:
        drafter = init_from_target(random_drafter(dcfg, a.seed), model)
    res = train(cfg, drafter, target, samples, eval_p, eos)
    _log(d.main, f"trained {res.step} steps in {time.perf_counter() - t0:.0f}s -> {a.out}"
                 + (f"; held-out tau {res.taus[-1]['tau']:.3f}" if res.taus else ""))
    if d.world > 1:
        torch.distributed.destroy_process_group()
    return 0


def warm_start_config(a: argparse.Namespace, target: TargetSpec) -> DFlashConfig:
    """The ``--init-from`` checkpoint's config, checked against the target and any drafter flags given."""
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
