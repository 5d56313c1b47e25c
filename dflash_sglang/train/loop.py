"""The training loop: AdamW + warmup/cosine, grad clipping, tau evaluation, resumable checkpoints, DDP.

Under ``torchrun`` (WORLD_SIZE > 1) the process group is initialised from the environment, every rank
takes a disjoint slice of each epoch's shuffled order (DistributedSampler-style), gradients are
averaged by DistributedDataParallel, and only rank 0 evaluates and writes files.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..core.drafter import DFlashDrafter
from ..core.engine import EngineConfig, ReferenceEngine
from ..core.sampling import SamplingConfig
from ..core.target import HFTarget
from .data import Sample, online_taps
from .recipe import BlockLoss, build_batch, default_gamma, expected_accept, sample_anchors

STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.jsonl"


@dataclass(frozen=True)
class TrainConfig:
    out: str  # published checkpoint (config.json + model.safetensors)
    state_dir: str | None = None  # train_state.pt + logs; None: inside ``out``
    steps: int = 1000
    batch_size: int = 8  # sequences per step per rank
    blocks_per_seq: int = 16  # anchors (blocks) drawn per sequence
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    gamma: float | None = None  # None: default_gamma(block_size)
    seed: int = 0
    device: str = "cpu"
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_max_new_tokens: int = 48
    save_every: int = 100
    save_dtype: str = "bfloat16"  # dtype of the published model.safetensors
    head_dtype: str = "float32"  # matmul dtype of the borrowed LM head during training
    resume: bool = True
    stop_at: int | None = None  # stop (and checkpoint) after this step, as if interrupted
    show_progress: bool = True


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


def train(cfg: TrainConfig, drafter: DFlashDrafter, target: HFTarget, samples: list[Sample],
          eval_prompts: list[list[int]], eos_token_ids: tuple[int, ...]) -> TrainResult:
    d = init_distributed(cfg.device)
    dev = rank_device(cfg.device, d)
    torch.manual_seed(cfg.seed)
    gamma = cfg.gamma or default_gamma(drafter.cfg.block_size)
    module = BlockLoss(drafter.to(dev).float().train(), target.embed_weight, target.lm_head_weight, gamma,
                       getattr(torch, cfg.head_dtype))
    model: torch.nn.Module = module
    if d.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(module)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    res = _load_state(cfg, drafter, opt, sched) if cfg.resume else TrainResult(0)
    last = min(cfg.steps, cfg.stop_at or cfg.steps)
    bar = tqdm(total=cfg.steps, initial=res.step, desc="train", disable=not (cfg.show_progress and d.main))
    while res.step < last:
        rec = _train_step(cfg, model, module, opt, sched, target, samples, res.step, d)
        res.step += 1
        bar.update(1)
        res.history.append(rec)
        if res.step % cfg.log_every == 0 or res.step == last:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc_len=f"{rec['acc_len']:.2f}")
        if cfg.eval_every and res.step % cfg.eval_every == 0 and res.step < cfg.steps:
            _evaluate(cfg, drafter, target, eval_prompts, eos_token_ids, res, d)
        if res.step % cfg.save_every == 0 or res.step == last:
            if res.step == cfg.steps:
                _evaluate(cfg, drafter, target, eval_prompts, eos_token_ids, res, d)
            _save(cfg, drafter, opt, sched, res, d)
    bar.close()
    return res


def _train_step(cfg: TrainConfig, model: torch.nn.Module, module: BlockLoss, opt: torch.optim.Optimizer,
                sched: Any, target: HFTarget, samples: list[Sample], step: int, d: Dist) -> dict[str, float]:
    gen = step_generator(cfg, step, d)
    picked = [samples[i] for i in batch_indices(step, len(samples), cfg, d)]
    anchors = [sample_anchors(s.prompt_len, len(s.ids), cfg.blocks_per_seq, gen) for s in picked]
    taps = [s.taps for s in picked]
    if any(t is None for t in taps):
        taps = [t.cpu() for t in online_taps(target, picked)]
    cfgd = module.drafter.cfg
    batch = build_batch([s.ids for s in picked], anchors, taps, cfgd.block_size, cfg.blocks_per_seq,
                        int(cfgd.mask_token_id)).to(next(module.parameters()).device)
    out = model(batch)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(module.drafter.parameters(), cfg.grad_clip)
    opt.step()
    sched.step()
    acc = expected_accept(out.correct, out.valid)
    return {"step": step + 1, "loss": float(out.loss.detach()), "acc_len": acc,
            "grad_norm": float(gnorm), "lr": float(sched.get_last_lr()[0])}


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


def _evaluate(cfg: TrainConfig, drafter: DFlashDrafter, target: HFTarget, prompts: list[list[int]],
              eos: tuple[int, ...], res: TrainResult, d: Dist) -> None:
    if d.main and prompts:
        tau = measure_tau(drafter, target, prompts, eos, cfg.eval_max_new_tokens)
        res.taus.append({"step": res.step, "tau": tau})
        tqdm.write(f"step {res.step}: held-out tau = {tau:.3f}")
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
    drafter.save_pretrained(out, dtype=getattr(torch, cfg.save_dtype) if cfg.save_dtype else None)
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
