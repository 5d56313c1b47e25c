"""Prompt selection shared by generate and the training data."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_sglang.prompts import first_per_category, load_prompts


def test_first_per_category_keeps_file_order(tmp_path: Path) -> None:
    rows = [("a", "x1"), ("a", "x2"), ("b", "y1"), ("a", "x3"), ("c", "z1"), ("b", "y2"), ("b", "y3")]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"category": c, "prompt": t}) + "\n" for c, t in rows))
    picked = first_per_category(load_prompts(f), 2)
    assert [(p.category, p.text) for p in picked] == [("a", "x1"), ("a", "x2"), ("b", "y1"), ("c", "z1"),
                                                        ("b", "y2")]
    assert first_per_category(load_prompts(f), 0) == []
