"""The task-diverse prompt mix: deterministic, covers every task, never contains evaluation prompts."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from dflash_sglang.prompts import shared_data_dir
from dflash_sglang.train.prompt_mix import TEMPLATES, first_sentence, mixed_prompts, write_prompt_mix

DATA = shared_data_dir()
TEXTS = [f"Ann has {i} apples. She buys {i + 1} more? How many now?" for i in range(50)]


def test_every_task_appears_and_rows_are_seeded():
    rows = mixed_prompts(TEXTS, 600, seed=3)
    counts = Counter(r["task"] for r in rows)
    assert set(counts) == set(TEMPLATES)
    assert min(counts.values()) > 600 / len(TEMPLATES) / 3  # roughly uniform
    assert rows == mixed_prompts(TEXTS, 600, seed=3)
    assert rows != mixed_prompts(TEXTS, 600, seed=4)


def test_prompts_embed_their_source_text():
    for r in mixed_prompts(TEXTS, 200):
        text = TEXTS[r["source_row"]]
        assert text in r["prompt"] or first_sentence(text) in r["prompt"]
        assert "{" not in r["prompt"]


def test_first_sentence():
    assert first_sentence("A b. C d.") == "A b."
    assert first_sentence("Why? Because.") == "Why?"
    assert first_sentence("no end") == "no end"


def test_cli_writes_jsonl(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"question": t}) + "\n" for t in TEXTS))
    out = write_prompt_mix(src, tmp_path / "mix.jsonl", 40, seed=1)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and all(r["prompt"] for r in rows)


@pytest.mark.skipif(not (DATA / "gsm8k_train.jsonl").exists(), reason="shared data not present")
def test_no_spec_bench_prompt_in_the_mix():
    bench = [json.loads(line)["turns"][0] for line in (DATA / "spec_bench_questions.jsonl").open()]
    texts = [json.loads(line)["question"] for line in (DATA / "gsm8k_train.jsonl").open()]
    prompts = {r["prompt"] for r in mixed_prompts(texts, 4000)}
    assert not prompts & set(bench)
    assert not any(b in p for b in bench[:80] for p in list(prompts)[:500])
