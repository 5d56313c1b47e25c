"""The training loop: AdamW + warmup/cosine, grad clipping, tau evaluation, resumable checkpoints, DDP.

Under ``torchrun`` (WORLD_SIZE > 1) the process group is initialised from the environment, every rank
takes a disjoint slice of each epoch's shuffled order (DistributedSampler-style), gradients are
averaged by DistributedDataParallel, and only rank 0 evaluates and writes files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parametrize
from tqdm import tqdm

from ..core.draft_head import cpu_has_native_bf16
from ..core.drafter import DFlashDrafter
from ..core.engine import EngineConfig, ReferenceEngine
from ..core.sampling import SamplingConfig
from ..core.target import HFTarget
from .data import Sample, online_taps
from .precondition import is_preconditioned, precondition, published, tap_scales
from .prompt_labels import greedy_labels
from .recipe import BlockLoss, build_batch, default_gamma, expected_accept, fresh_positions, sample_anchors
from .teacher import TopLayersTeacher

STATE_FILE = "train_state.pt"
FRESH_WINDOW = 8  # --anchors fresh: a block whose first 8 tokens repeat earlier text is a loop
LOG_FILE = "train_log.jsonl"


def _opt(default: Any, help: str, **kw: Any) -> Any:
    """A TrainConfig field that ``dflash-sglang train`` exposes as ``--name`` (help text, choices)."""
    return field(default=default, metadata={"cli": True, "help": help, **kw})


@dataclass(frozen=True)
class TrainConfig:
    """The training loop's settings; ``dflash-sglang train`` builds its optimisation flags from the
    fields marked with ``_opt`` (one source of truth for names, types and defaults)."""

    out: str  # published checkpoint (config.json + model.safetensors)
    state_dir: str | None = None  # train_state.pt + logs; None: inside ``out``
    steps: int = _opt(1000, "optimizer steps")
    batch_size: int = _opt(8, "sequences per step per rank")
    blocks_per_seq: int = _opt(16, "anchors (blocks) drawn per sequence")
    lr: float = _opt(6e-4, "peak learning rate")
    min_lr_ratio: float = _opt(0.1, "cosine floor as a fraction of --lr")
    warmup: int = _opt(50, "linear warmup steps")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    grad_clip: float = _opt(1.0, "gradient norm clip")
    gamma: float | None = _opt(None, "loss weight decay over block positions (default: by block size)")
    seed: int = _opt(0, "seed of init, batches and anchors")
    device: str = _opt("cpu", "cpu | cuda (one GPU per rank under torchrun)")
    log_every: int = _opt(10, "progress-bar update period (steps)")
    eval_every: int = _opt(0, "held-out tau period (steps; 0: only at the end)")
    eval_max_new_tokens: int = _opt(48, "new tokens per held-out prompt in the tau evaluation")
    save_every: int = _opt(100, "checkpoint period (steps)")
    save_dtype: str = _opt("bfloat16", "dtype of the published model.safetensors",
                           choices=("bfloat16", "float32"))
    precondition: bool = _opt(True, "train fc in units where every tap feature has RMS 1 "
                                    "(train.precondition); the saved checkpoint is the same plain fc")
    head_dtype: str = _opt("auto", "matmul dtype of the frozen LM head in the loss (auto: bf16 only on CPUs "
                                   "with native bf16, see core.draft_head)",
                           choices=("auto", "bfloat16", "float32"))
    compute_dtype: str = _opt("auto", "autocast dtype of the drafter's matmuls in the training step (auto: "
                                      "bf16 on CPUs with native bf16, else float32); weights, Adam state "
                                      "and the softmax stay float32", choices=("auto", "bfloat16", "float32"))
    anchors: str = _opt("all", "which response positions may anchor a training block: all, or fresh "
                               "(skip blocks whose first 8 tokens repeat earlier text of the same answer, "
                               "i.e. the target looping; recipe.fresh_positions)", choices=("all", "fresh"))
    soft_labels: float = _opt(0.0, "share of the target's own next-token distribution in each label "
                                   "(0: the stored greedy tokens only; 1: cross-entropy to the target's "
                                   "distribution, i.e. KL), recomputed from the last tap (train.teacher)")
    predraft_share: float = _opt(0.0, "share of steps whose blocks are pre-draft blocks (issue #20): the "
                                      "anchor token and 1..--predraft-known tokens after it are known "
                                      "without target features, as when block n+1 is drafted before "
                                      "verify(n); the checkpoint format is unchanged")
    predraft_known: int = _opt(2, "most known tokens after the anchor in a pre-draft block")
    prompt_anchors: float = _opt(0.0, "share of each sequence's blocks anchored inside its prompt, "
                                      "labelled by the target's greedy next tokens from one prefill for "
                                      "as long as the prompt text follows them (train.prompt_labels; "
                                      "--store only: rows whose shard has prompt labels)")
    resume: bool = True
    stop_at: int | None = None  # stop (and checkpoint) after this step, as if interrupted
    show_progress: bool = True

    def __post_init__(self) -> None:
        for name in ("soft_labels", "predraft_share", "prompt_anchors"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)} is a share: give 0 .. 1")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


@dataclass
class TrainResult:
    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    taus: list[dict[str, float]] = field(default_factory=list)


def init_from_target(drafter: DFlashDrafter, model: torch.nn.Module) -> DFlashDrafter:
    """Start the drafter's final norm at the target's, so its LM-head logits start at a sane scale."""
    norm = getattr(getattr(model, "model", model), "norm", None)
    if norm is not None and norm.weight.shape == drafter.norm.weight.shape:
        with torch.no_grad():
            drafter.norm.weight.copy_(norm.weight.float())
    return drafter


_LAYER_PARAMS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                 "input_layernorm", "post_attention_layernorm")


def copy_top_layers(drafter: DFlashDrafter, model: torch.nn.Module) -> list[int]:
    """Start draft layer i as the target's layer L - n + i (the n top layers), and the context path as
    that stack's input: ``fc`` picks the tap of layer L - n - 1 (the top layers' input) when it is a
    tap, ``hidden_norm`` starts at layer L - n's input norm. Draft q/k norms (the target has none)
    stay at 1. -> the copied target layer ids. Raises ValueError when shapes differ."""
    layers = getattr(model, "model", model).layers
    n, total = len(drafter.layers), len(layers)
    ids = list(range(total - n, total))
    with torch.no_grad():
        for draft, i in zip(drafter.layers, ids, strict=True):
            src = layers[i]
            for name in _LAYER_PARAMS:
                want, got = draft.get_submodule(name).weight, src.get_submodule(name).weight
                if want.shape != got.shape:
                    raise ValueError(f"target layer {i} {name} {tuple(got.shape)} != drafter "
                                     f"{tuple(want.shape)}")
                want.copy_(got.float())
        below = ids[0] - 1
        taps = list(drafter.cfg.target_layer_ids)
        if below in taps:
            h = drafter.cfg.hidden_size
            drafter.fc.weight.zero_()
            j = taps.index(below)
            drafter.fc.weight[:, j * h: (j + 1) * h] = torch.eye(h)
            drafter.hidden_norm.weight.copy_(layers[ids[0]].input_layernorm.weight.float())
    return ids


def init_distributed(device: str) -> Dist:
    """Initialise torch.distributed from the torchrun environment when WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size())


def rank_device(device: str, d: Dist) -> str:
    if device == "cuda" and d.world > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', d.rank))}"
    return device


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine down to min_lr_ratio at cfg.steps."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def batch_indices(step: int, n: int, cfg: TrainConfig, d: Dist) -> list[int]:
    """This rank's sample indices for ``step``: epoch-wise seeded shuffle, sharded rank::world."""
    per_epoch = max(1, (n // d.world) // cfg.batch_size)
    epoch, b = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 7919 + epoch)).tolist()
    shard = order[d.rank :: d.world]
    return [shard[(b * cfg.batch_size + j) % len(shard)] for j in range(cfg.batch_size)]


def step_generator(cfg: TrainConfig, step: int, d: Dist) -> torch.Generator:
    return torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 131 + d.rank)


def step_known(cfg: TrainConfig, step: int) -> int:
    """Known tokens after each anchor in ``step``'s blocks: 0 (ordinary), or on a ``predraft_share`` of
    the steps 1..predraft_known. Its own seeded draw (the same on every rank: one block length per
    step), so a run without pre-draft blocks draws exactly the batches it always did."""
    if cfg.predraft_share <= 0:
        return 0
    g = torch.Generator().manual_seed(cfg.seed * 7_777_777 + step)
    if float(torch.rand(1, generator=g)) >= cfg.predraft_share:
        return 0
    return int(torch.randint(1, cfg.predraft_known + 1, (1,), generator=g))


def train(cfg: TrainConfig, drafter: DFlashDrafter, target: HFTarget, samples: list[Sample],
          eval_prompts: list[list[int]], eos_token_ids: tuple[int, ...],
          eval_samples: list[Sample] | None = None, train_vocab: torch.Tensor | None = None) -> TrainResult:
    """Trains ``drafter`` on ``samples``. Evaluation (every cfg.eval_every steps and at the end): greedy
    tau on ``eval_prompts`` (reference engine) and the teacher-forced acceptance on ``eval_samples``
    (held-out distilled answers, fixed anchors). ``train_vocab``: see :class:`BlockLoss`."""
    d = init_distributed(cfg.device)
    dev = rank_device(cfg.device, d)
    torch.manual_seed(cfg.seed)
    gamma = cfg.gamma or default_gamma(drafter.cfg.block_size)
    head_dtype = None if cfg.head_dtype == "auto" else getattr(torch, cfg.head_dtype)
    drafter = drafter.to(dev).float().train()
    if cfg.precondition:
        precondition(drafter, _tap_scales(samples, target))
    teacher = TopLayersTeacher(target.model, target.tap_layer_ids) if cfg.soft_labels else None
    module = BlockLoss(drafter, target.embed_weight, target.lm_head_weight, gamma, head_dtype, train_vocab,
                       teacher, cfg.soft_labels)
    model: torch.nn.Module = module
    if d.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(module)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    res = _load_state(cfg, drafter, opt, sched) if cfg.resume else TrainResult(0)
    last = min(cfg.steps, cfg.stop_at or cfg.steps)
    bar = tqdm(total=cfg.steps, initial=res.step, desc="train", disable=not (cfg.show_progress and d.main))
    evals = (eval_prompts, eval_samples or [], eos_token_ids)
    if cfg.eval_every and res.step == 0:  # the starting point (a warm start's, or a random drafter's)
        _evaluate(cfg, module, target, evals, res, d)
    while res.step < last:
        rec = _train_step(cfg, model, module, opt, sched, target, samples, res.step, d)
        res.step += 1
        bar.update(1)
        res.history.append(rec)
        if res.step % cfg.log_every == 0 or res.step == last:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc_len=f"{rec['acc_len']:.2f}")
        if cfg.eval_every and res.step % cfg.eval_every == 0 and res.step < cfg.steps:
            _evaluate(cfg, module, target, evals, res, d)
        if res.step % cfg.save_every == 0 or res.step == last:
            if res.step == cfg.steps:
                _evaluate(cfg, module, target, evals, res, d)
            _save(cfg, drafter, opt, sched, res, d)
    bar.close()
    if is_preconditioned(drafter):  # hand back the plain drafter that was saved
        parametrize.remove_parametrizations(drafter.fc, "weight", leave_parametrized=True)
    return res


def step_autocast(cfg: TrainConfig, device: str) -> contextlib.AbstractContextManager:
    """The autocast context of the training step's forward (chosen once from ``cfg.compute_dtype``).

    bf16 autocast runs the drafter's linear layers and attention matmuls in bf16 against float32
    master weights. On the 2-core AVX-512-BF16 host a bf16 GEMM of the drafter's shapes runs 2.5-3x a
    float32 one (``benchmarks/train_throughput.py`` gives the whole step)."""
    want = cfg.compute_dtype
    if want == "auto":
        cpu = device == "cpu"
        want = "bfloat16" if (cpu and cpu_has_native_bf16()) or (not cpu and torch.cuda.is_bf16_supported()) \
            else "float32"
    if want == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def _tap_scales(samples: list[Sample], target: HFTarget) -> torch.Tensor:
    """Per-dimension 1/RMS of the training taps (cached ones, else a few recomputed)."""
    cached = [s.taps for s in samples[:64] if s.taps is not None]
    return tap_scales(cached or [t.cpu() for t in online_taps(target, samples[:8])])


def _train_step(cfg: TrainConfig, model: torch.nn.Module, module: BlockLoss, opt: torch.optim.Optimizer,
                sched: Any, target: HFTarget, samples: list[Sample], step: int, d: Dist) -> dict[str, float]:
    started = time.perf_counter()
    gen = step_generator(cfg, step, d)
    picked = [samples[i] for i in batch_indices(step, len(samples), cfg, d)]
    anchors = [sample_anchors(s.prompt_len, len(s.ids), cfg.blocks_per_seq, gen,
                              fresh_positions(s.ids, FRESH_WINDOW) if cfg.anchors == "fresh" else None,
                              cfg.prompt_anchors if s.greedy is not None else 0.0)
               for s in picked]
    paths = [greedy_labels(s.ids, s.prompt_len, s.greedy) for s in picked] if cfg.prompt_anchors else None
    taps = [s.taps for s in picked]
    if any(t is None for t in taps):
        taps = [t.cpu() for t in online_taps(target, picked)]
    cfgd = module.drafter.cfg
    batch = build_batch([s.ids for s in picked], anchors, taps, cfgd.block_size, cfg.blocks_per_seq,
                        int(cfgd.mask_token_id), known=step_known(cfg, step), paths=paths
                        ).to(next(module.parameters()).device)
    with step_autocast(cfg, str(batch.taps.device)):
        out = model(batch)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(module.drafter.parameters(), cfg.grad_clip)
    opt.step()
    sched.step()
    acc = expected_accept(out.correct, out.valid)
    return {"step": step + 1, "loss": float(out.loss.detach()), "acc_len": acc,
            "grad_norm": float(gnorm), "lr": float(sched.get_last_lr()[0]),
            "blocks": int(out.valid.any(-1).sum()), "step_s": round(time.perf_counter() - started, 4)}


@torch.no_grad()
def measure_tau(drafter: DFlashDrafter, target: HFTarget, prompts: list[list[int]],
                eos_token_ids: tuple[int, ...], max_new_tokens: int) -> float:
    """Greedy acceptance length (committed tokens per verify step) with the reference engine."""
    if not prompts:
        return math.nan
    was_training = drafter.training
    drafter.eval()
    engine = ReferenceEngine(target, drafter, EngineConfig(drafter.cfg.block_size, max_new_tokens,
                                                           eos_token_ids))
    committed = steps = 0
    for p in prompts:
        r = engine.generate([p], SamplingConfig.uniform(1, 0.0, 0, 1.0))[0]
        committed, steps = committed + sum(r.committed_per_step), steps + r.steps
    drafter.train(was_training)
    return committed / steps if steps else math.nan


@torch.no_grad()
def heldout_acceptance(module: BlockLoss, samples: list[Sample], blocks_per_seq: int,
                       seed: int = 20261204, fresh: bool = False,
                       known: int = 0) -> tuple[float, list[float]]:
    """Teacher-forced acceptance on held-out distilled answers, anchors drawn with a fixed seed (the same
    blocks at every evaluation). -> (mean 1 + leading correct drafts over full blocks, per block position
    the share of blocks whose drafts are correct up to and including it). For greedy decoding of the
    target's own answers this is tau at random anchors, without running the target. ``fresh``: only
    anchors outside the answers' loops (recipe.fresh_positions), the text that a short generation
    such as Spec-Bench's 64 tokens meets. ``known``: pre-draft blocks (recipe.build_batch)."""
    gen = torch.Generator().manual_seed(seed)
    was = module.training
    module.eval()
    runs: list[torch.Tensor] = []
    cfgd = module.drafter.cfg
    dev = next(module.parameters()).device
    for i in range(0, len(samples), 4):
        part = samples[i: i + 4]
        anchors = [sample_anchors(s.prompt_len, len(s.ids), blocks_per_seq, gen,
                                  fresh_positions(s.ids, FRESH_WINDOW) if fresh else None) for s in part]
        batch = build_batch([s.ids for s in part], anchors, [s.taps for s in part], cfgd.block_size,
                            blocks_per_seq, int(cfgd.mask_token_id), known).to(dev)
        correct, valid = module.draft_hits(batch)  # as served: the drafter's own draft head
        runs.append(correct.long().cumprod(-1)[valid.all(-1)])  # [blocks, B-1]
    module.train(was)
    run = torch.cat(runs).float() if runs else torch.zeros(0, cfgd.block_size - 1)
    if not len(run):
        return math.nan, []
    return float(1 + run.sum(-1).mean()), [round(float(x), 4) for x in run.mean(0)]


def _evaluate(cfg: TrainConfig, module: BlockLoss, target: HFTarget,
              evals: tuple[list[list[int]], list[Sample], tuple[int, ...]], res: TrainResult,
              d: Dist) -> None:
    prompts, samples, eos = evals
    if d.main and (prompts or samples):
        rec: dict[str, Any] = {"step": res.step}
        if samples:
            acc, pos = heldout_acceptance(module, samples, cfg.blocks_per_seq)
            rec["heldout_acc_len"], rec["heldout_pos"] = acc, pos
            acc, pos = heldout_acceptance(module, samples, cfg.blocks_per_seq, fresh=True)
            rec["heldout_fresh_acc_len"], rec["heldout_fresh_pos"] = acc, pos
            if cfg.predraft_share > 0:  # the pre-draft form with one known token (a hit at accept 0)
                acc, pos = heldout_acceptance(module, samples, cfg.blocks_per_seq, fresh=True, known=1)
                rec["heldout_predraft_acc_len"], rec["heldout_predraft_pos"] = acc, pos
        if prompts:
            rec["tau"] = measure_tau(module.drafter, target, prompts, eos, cfg.eval_max_new_tokens)
        res.taus.append(rec)
        tqdm.write(f"step {res.step}: held-out " + ", ".join(f"{k} = {v:.3f}" for k, v in rec.items()
                                                             if isinstance(v, float)))
    if d.world > 1:
        dist.barrier()


def _save(cfg: TrainConfig, drafter: DFlashDrafter, opt: torch.optim.Optimizer, sched: Any,
          res: TrainResult, d: Dist) -> None:
    if not d.main:
        return
    out, sdir = Path(cfg.out), Path(cfg.state_dir or cfg.out)
    sdir.mkdir(parents=True, exist_ok=True)
    state = {"drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "step": res.step, "history": res.history, "taus": res.taus, "rng": torch.get_rng_state(),
             "config": asdict(cfg)}
    torch.save(state, sdir / (STATE_FILE + ".tmp"))
    (sdir / (STATE_FILE + ".tmp")).rename(sdir / STATE_FILE)
    published(drafter).save_pretrained(out, dtype=getattr(torch, cfg.save_dtype) if cfg.save_dtype else None)
    with (sdir / LOG_FILE).open("w") as f:
        for rec in res.history:
            f.write(json.dumps(rec) + "\n")
    if res.taus:
        (sdir / "eval_tau.json").write_text(json.dumps(res.taus, indent=1) + "\n")


def _load_state(cfg: TrainConfig, drafter: DFlashDrafter, opt: torch.optim.Optimizer,
                sched: Any) -> TrainResult:
    path = Path(cfg.state_dir or cfg.out) / STATE_FILE
    if not path.is_file():
        return TrainResult(0)
    state = torch.load(path, map_location="cpu", weights_only=False)
    drafter.load_state_dict(state["drafter"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return TrainResult(int(state["step"]), list(state["history"]), list(state.get("taus", [])))
