"""``dflash-sglang distill``: the target answers corpus prompts greedily; the ids go to a distill store.

Prompts are taken in a task-stratified order (every prefix of it has the corpus's task proportions,
file order within a task), the first ``--limit`` of them; prompts whose key is already in the store
are skipped, so rerunning the command (with the same or a larger limit) extends the store. Answers
come from :class:`dflash_sglang.train.fastgen.SlotGenerator` (continuous batching, greedy, cut after
EOS) where the target has a Llama-style shape, else from :func:`dflash_sglang.train.data.answer_batch`
(left-padded batches). Every ``shard_rows`` finished answers become one store shard; with tap layers
given, the tap features the generator computed anyway are written beside it (local cache, not data).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from ..core.target import HFTarget
from .data import GenSettings, answer_batch
from .distill_store import DistillStore, prompt_key
from .fastgen import Finished, SlotGenerator, supports


@dataclass(frozen=True)
class Todo:
    row: int  # corpus row index (file order)
    prompt: str
    key: int


def stratified_order(tasks: Sequence[str]) -> list[int]:
    """Row indices ordered by (rank within its task + 0.5) / task size: prefixes keep task proportions."""
    size = Counter(tasks)
    seen: Counter[str] = Counter()
    score = []
    for i, t in enumerate(tasks):
        score.append(((seen[t] + 0.5) / size[t], t, i))
        seen[t] += 1
    return [i for _, _, i in sorted(score)]


def pending(rows: Sequence[dict], done: set[int], limit: int | None, split: str = "train") -> list[Todo]:
    """The first ``limit`` rows of ``split`` in stratified order, minus those already answered."""
    train = [i for i, r in enumerate(rows) if r.get("split", "train") == split]
    order = [train[j] for j in stratified_order([rows[i].get("task", "") for i in train])][:limit]
    todo = [Todo(i, rows[i]["prompt"], prompt_key(rows[i]["prompt"])) for i in order]
    return [t for t in todo if t.key not in done]


@dataclass(frozen=True)
class DistillReport:
    sequences: int
    answer_tokens: int
    prompt_tokens: int
    skipped: int  # prompts too long for max_len
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.answer_tokens / max(self.seconds, 1e-9)


# Prompts are answered in groups of this many (in the stratified order), each group by prompt length:
# decode attention runs every slot up to the longest live context, so slots of similar lengths waste
# less (measured: attention was 44% of a distill decode step with lengths mixed).
LENGTH_GROUP = 1024


def length_grouped(order: Sequence[int], lengths: Sequence[int], group: int) -> list[int]:
    """``order`` cut into consecutive groups of ``group``; each group sorted by ``lengths[i]`` (stable)."""
    out: list[int] = []
    for g in range(0, len(order), group):
        out += sorted(order[g: g + group], key=lambda i: lengths[i])
    return out


def distill_into(store: DistillStore, target: HFTarget, tokenize: Callable[[str], list[int]],
                 todo: Sequence[Todo], s: GenSettings, shard_rows: int, log: Callable[[str], None],
                 max_len: int = 2048, stop_on_loop: int = 0) -> DistillReport:
    """Answers ``todo``; one shard per ``shard_rows`` answers (+ taps when ``s.store_taps``).

    ``s.batch_size`` is the number of concurrent sequences; ``s.tap_layer_ids`` the taps to keep."""
    t_all = time.perf_counter()
    ids = [tokenize(t.prompt) for t in todo]
    fits = [i for i, x in enumerate(ids) if len(x) + s.max_answer_tokens <= max_len]
    skipped = len(todo) - len(fits)
    if skipped:
        log(f"distill: {skipped} prompts longer than {max_len - s.max_answer_tokens} tokens skipped")
    fits = length_grouped(fits, [len(x) for x in ids], LENGTH_GROUP)
    rows: list[tuple[list[int], int, int, int]] = []
    taps: list[torch.Tensor] = []
    n_seq = n_ans = n_prompt = 0
    t0 = time.perf_counter()
    for f in _answers(target, [(i, ids[i]) for i in fits], s, max_len, stop_on_loop):
        rows.append((f.ids, f.prompt_len, todo[f.index].key, todo[f.index].row))
        if s.store_taps and f.taps is not None:
            taps.append(f.taps)
        if len(rows) == shard_rows or (n_seq + len(rows) == len(fits)):
            path = store.append(rows)
            if taps:
                store.write_taps(path, s.tap_layer_ids, taps)
            dt = time.perf_counter() - t0
            ans = sum(len(r[0]) - r[1] for r in rows)
            n_seq, n_ans, n_prompt = n_seq + len(rows), n_ans + ans, n_prompt + sum(r[1] for r in rows)
            log(json.dumps({"shard": path.name, "sequences": len(rows), "answer_tokens": ans,
                            "seconds": round(dt, 1), "tok_s": round(ans / dt, 1), "done": n_seq,
                            "of": len(fits), "total_tok_s": round(n_ans / (time.perf_counter() - t_all), 1)}))
            rows, taps, t0 = [], [], time.perf_counter()
    return DistillReport(n_seq, n_ans, n_prompt, skipped, time.perf_counter() - t_all)


def _answers(target: HFTarget, prompts: list[tuple[int, list[int]]], s: GenSettings,
             max_len: int, stop_on_loop: int = 0) -> Iterator[Finished]:
    """Greedy answers, as they finish: the slot engine where it applies, else HF batches (which
    cannot stop on a loop: ``stop_on_loop`` needs the slot engine)."""
    if supports(target.model) is None:
        gen = SlotGenerator(target.model, s.batch_size, max_len, s.max_answer_tokens, s.eos_token_ids,
                            s.tap_layer_ids if s.store_taps else (), stop_on_loop=stop_on_loop)
        yield from gen.run(prompts)
        return
    if stop_on_loop:
        raise ValueError(f"--stop-on-loop needs the slot engine: {supports(target.model)}")
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i][1]))  # similar lengths share a batch
    for b in range(0, len(order), s.batch_size):
        idx = order[b: b + s.batch_size]
        for i, q in zip(idx, answer_batch(target, [prompts[i][1] for i in idx], s), strict=True):
            yield Finished(prompts[i][0], q.ids.tolist(), q.prompt_len, q.taps)
