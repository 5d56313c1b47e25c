"""``dflash-sglang distill``: the target answers corpus prompts greedily; the ids go to a distill store.

Prompts are taken in a task-stratified order (every prefix of it has the corpus's task proportions,
file order within a task), the first ``--limit`` of them; prompts whose key is already in the store
are skipped, so rerunning the command (with the same or a larger limit) extends the store. Answers
come from :func:`dflash_sglang.train.data.answer_batch` (greedy, left-padded batches, cut after EOS),
one store shard per ``shard_batches`` batches.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.target import HFTarget
from .data import GenSettings, answer_batch
from .distill_store import DistillStore, prompt_key


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


def pending(rows: Sequence[dict], done: set[int], limit: int | None) -> list[Todo]:
    """The first ``limit`` train rows in stratified order, minus those already answered."""
    train = [i for i, r in enumerate(rows) if r.get("split", "train") == "train"]
    order = [train[j] for j in stratified_order([rows[i].get("task", "") for i in train])][:limit]
    todo = [Todo(i, rows[i]["prompt"], prompt_key(rows[i]["prompt"])) for i in order]
    return [t for t in todo if t.key not in done]


@dataclass(frozen=True)
class DistillReport:
    sequences: int
    answer_tokens: int
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.answer_tokens / max(self.seconds, 1e-9)


def distill_into(store: DistillStore, target: HFTarget, tokenize: Callable[[str], list[int]],
                 todo: Sequence[Todo], s: GenSettings, shard_batches: int,
                 log: Callable[[str], None]) -> DistillReport:
    """Answers ``todo`` in chunks of shard_batches * batch_size prompts, one shard per chunk."""
    chunk = s.batch_size * shard_batches
    t_all, n_seq, n_ans = time.perf_counter(), 0, 0
    for c in range(0, len(todo), chunk):
        part = todo[c: c + chunk]
        t0 = time.perf_counter()
        ids = [tokenize(t.prompt) for t in part]
        order = sorted(range(len(part)), key=lambda i: len(ids[i]))  # similar lengths share a batch
        rows = []
        for b in range(0, len(order), s.batch_size):
            idx = order[b: b + s.batch_size]
            for i, q in zip(idx, answer_batch(target, [ids[i] for i in idx], s), strict=True):
                rows.append((q.ids.tolist(), q.prompt_len, part[i].key, part[i].row))
        path = store.append(rows)
        dt = time.perf_counter() - t0
        ans = sum(len(r[0]) - r[1] for r in rows)
        n_seq, n_ans = n_seq + len(rows), n_ans + ans
        log(json.dumps({"shard": path.name, "sequences": len(rows), "answer_tokens": ans,
                        "seconds": round(dt, 1), "tok_s": round(ans / dt, 1), "done": c + len(part),
                        "of": len(todo), "total_tok_s": round(n_ans / (time.perf_counter() - t_all), 1)}))
    return DistillReport(n_seq, n_ans, time.perf_counter() - t_all)
