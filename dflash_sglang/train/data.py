"""Self-distillation data: the frozen target answers the prompts (greedy); the result is cached on disk.

Each sequence is ``prompt ids + answer ids`` in the target's tokenization (chat template applied),
with the prompt length. While answering, the tap-layer outputs of every token the target has run
(all but the last) are captured for free and stored in bf16, so training needs no target forward.
The cache is a folder of shards (``shard_00000_<rows>.pt`` ...), one per generation batch, keyed by target
path + data files + settings; an interrupted run resumes at the first missing shard.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.target import HFTarget, left_pad


@dataclass(frozen=True)
class Sample:
    ids: torch.Tensor  # [n] long: prompt + answer
    prompt_len: int
    taps: torch.Tensor | None  # [n - 1, T*H] bf16 tap features of ids[:-1]; None = compute online
    greedy: torch.Tensor | None = None  # [prompt_len] target's greedy next token after each prompt prefix


@dataclass(frozen=True)
class GenSettings:
    max_answer_tokens: int = 160
    batch_size: int = 32
    eos_token_ids: tuple[int, ...] = ()
    tap_layer_ids: tuple[int, ...] = ()
    store_taps: bool = True
    dtype: str = "float32"  # the answering target's dtype (part of the cache key)


def cache_key(target_path: str | Path, data_files: Sequence[str | Path], s: GenSettings) -> str:
    """Hash of target path, data files (path, size, mtime) and the settings.

    Shard b always holds prompts [b * batch_size, (b + 1) * batch_size) of the files (its file name
    carries its row count), so one cache serves every --num-prompts."""
    h = hashlib.sha256(str(Path(target_path).resolve()).encode())
    for f in data_files:
        st = Path(f).stat()
        h.update(f"{Path(f).resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(json.dumps(s.__dict__, sort_keys=True, default=list).encode())
    return h.hexdigest()[:16]


def build_dataset(target: HFTarget, prompts: list[list[int]], cache: Path, s: GenSettings,
                  show: bool = True, rank: int = 0, world: int = 1) -> list[Sample]:
    """Answer every prompt (resuming from the shards already in ``cache``) and load all shards.

    Under DDP rank r writes shards r, r + world, ...; all ranks then wait and load every shard."""
    cache.mkdir(parents=True, exist_ok=True)
    batches = [range(i, min(len(prompts), i + s.batch_size)) for i in range(0, len(prompts), s.batch_size)]
    for b, rows in enumerate(tqdm(batches, desc="self-distill", disable=not show)):
        shard = _shard(cache, b, len(rows))
        if shard.is_file() or b % world != rank:
            continue
        seqs = answer_batch(target, [prompts[i] for i in rows], s)
        tmp = shard.with_suffix(".tmp")
        torch.save([(q.ids, q.prompt_len, q.taps) for q in seqs], tmp)
        tmp.rename(shard)  # atomic: a shard on disk is always complete
    if world > 1:
        torch.distributed.barrier()
    return load_shards(cache, [len(r) for r in batches])


def _shard(cache: Path, b: int, rows: int) -> Path:
    return cache / f"shard_{b:05d}_{rows}.pt"


def load_shards(cache: Path, sizes: list[int]) -> list[Sample]:
    out: list[Sample] = []
    for b, rows in enumerate(sizes):
        for ids, plen, taps in torch.load(_shard(cache, b, rows), weights_only=True):
            out.append(Sample(ids, int(plen), taps))
    return out


@torch.no_grad()
def answer_batch(target: HFTarget, prompts: list[list[int]], s: GenSettings) -> list[Sample]:
    """Greedy answers for a left-padded batch, capturing the tap features of every token run."""
    from transformers import DynamicCache

    dev = target.device
    bs, plen = len(prompts), max(len(p) for p in prompts)
    ids, valid, pos = left_pad(prompts, dev)  # [bs, P] each
    cache = DynamicCache()
    logits, t = forward_taps(target, ids, pos, valid.long(), cache)
    taps, toks = [t], []
    nxt, done = logits.argmax(-1), torch.zeros(bs, dtype=torch.bool, device=dev)
    eos = torch.tensor(list(s.eos_token_ids) or [-1], device=dev)
    for _ in range(s.max_answer_tokens):
        toks.append(nxt)
        done |= torch.isin(nxt, eos)
        if bool(done.all()) or len(toks) == s.max_answer_tokens:
            break
        pos = pos[:, -1:] + 1
        valid = torch.cat([valid, torch.ones(bs, 1, dtype=torch.bool, device=dev)], dim=1)
        logits, t = forward_taps(target, nxt[:, None], pos, valid.long(), cache)
        taps.append(t)
        nxt = logits.argmax(-1)
    return _unpad(prompts, torch.stack(toks, 1), torch.cat(taps, 1), plen, s)


def _unpad(prompts: list[list[int]], answers: torch.Tensor, taps: torch.Tensor, plen: int,
           s: GenSettings) -> list[Sample]:
    """answers [bs, A], taps [bs, P + A - 1, T*H] -> one unpadded sequence per row (cut after EOS)."""
    out = []
    for i, p in enumerate(prompts):
        ans = answers[i].tolist()
        stop = next((j for j, t in enumerate(ans) if t in s.eos_token_ids), None)
        ans = ans if stop is None else ans[: stop + 1]
        ids = torch.tensor(p + ans, dtype=torch.long)
        t = taps[i, plen - len(p): plen + len(ans) - 1] if s.store_taps else None
        t = None if t is None else t.to(torch.bfloat16).cpu().clone()
        out.append(Sample(ids, len(p), t))
    return out


def padded_groups(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut into groups whose padded size (rows x longest) stays within
    ``max_tokens`` (a longer row still gets a group of its own): the batches of a prefill pass."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@torch.no_grad()
def online_taps(target: HFTarget, seqs: list[Sample]) -> list[torch.Tensor]:
    """Tap features [n - 1, T*H] of each sequence (right-padded batch; causal, so padding is inert)."""
    dev = target.device
    n = max(len(q.ids) for q in seqs) - 1
    ids = torch.zeros(len(seqs), n, dtype=torch.long, device=dev)
    valid = torch.zeros(len(seqs), n, dtype=torch.long, device=dev)
    for i, q in enumerate(seqs):
        ids[i, : len(q.ids) - 1] = q.ids[:-1].to(dev)
        valid[i, : len(q.ids) - 1] = 1
    pos = torch.arange(n, device=dev).expand(len(seqs), n)
    from transformers import DynamicCache

    taps = forward_taps(target, ids, pos, valid, DynamicCache())[1]
    return [taps[i, : len(q.ids) - 1] for i, q in enumerate(seqs)]


def forward_taps(target: HFTarget, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    """-> last-position logits [bs, V] and taps [bs, n, T*H]; the LM head runs on the last column only."""
    target._captured.clear()
    out = target.model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                       use_cache=True, logits_to_keep=1)
    taps = torch.cat([target._captured[i] for i in target.tap_layer_ids], dim=-1)
    return out.logits[:, -1].float(), taps


def prompt_ids_from_files(files: Sequence[str | Path], tokenize: Callable[[str], list[int]],
                          limit: int | None) -> list[list[int]]:
    from ..prompts import load_prompts

    texts = [p.text for f in files for p in load_prompts(f)]
    return [tokenize(t) for t in texts[:limit]]
