"""Prompt files: JSONL rows with ``prompt``, ``question`` (GSM8K) or ``turns`` (Spec-Bench, first turn)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .settings import settings


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = "all"


def shared_data_dir() -> Path:
    """``../shared/data`` beside the checkout, unless DFLASH_SGLANG_DATA says otherwise."""
    return settings().data


def spec_bench_path() -> Path:
    return shared_data_dir() / "spec_bench_questions.jsonl"


def _row_text(row: dict[str, Any], where: str) -> str:
    for key in ("prompt", "question"):
        if isinstance(row.get(key), str):
            return row[key]
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    raise ValueError(f"{where}: row has no 'prompt', 'question' or 'turns' field")


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"{p}: prompts file not found")
    out: list[Prompt] = []
    with (gzip.open(p, "rt") if p.suffix == ".gz" else p.open()) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            out.append(Prompt(_row_text(row, f"{p}:{i}"), str(row.get("category", "all"))))
            if limit is not None and len(out) >= limit:
                break
    return out


def first_per_category(prompts: list[Prompt], n: int) -> list[Prompt]:
    """The first ``n`` prompts of every category, in file order."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] <= n:
            out.append(p)
    return out


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """The target's chat template applied to one user turn, as token ids."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def eos_token_ids(model: Any, tok: Any) -> tuple[int, ...]:
    """Every end-of-sequence id the model's generation config, config and tokenizer name."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tok):
        e = getattr(src, "eos_token_id", None)
        ids.update([e] if isinstance(e, int) else (e or []))
    return tuple(sorted(ids))
