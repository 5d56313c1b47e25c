"""A task-diverse training prompt set built from plain source texts (e.g. GSM8K questions).

A drafter learns the target's answer *style*; GSM8K alone teaches only arithmetic word-problem
answers. Wrapping the same source texts in instruction templates of the kinds users send (translate,
summarise, rewrite, explain, extract, code, role-play, write) makes the target answer in those styles,
with no evaluation prompt (Spec-Bench, MT-Bench, HumanEval) anywhere in the data.

Output rows: ``{"prompt": str, "task": str, "source_row": int}``, shuffled by a seed; row i of the
output is a pure function of (source texts, n, seed).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

# task -> templates; {text} is one source text, {first} its first sentence.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "math": ("{text}", "Solve step by step: {text}"),
    "translation": ("Translate into German: {text}", "Translate the following text to French.\n\n{text}",
                    "Translate this into Spanish: {text}"),
    "summarization": ("Summarize the following text in one or two sentences.\n\n{text}",
                      "Give a short summary of this:\n{text}"),
    "rewrite": ("Rewrite the following more formally: {text}", "Paraphrase this text: {text}"),
    "explain": ("Explain what this problem is asking, without solving it: {text}",
                "What information is given in the following text?\n{text}"),
    "extraction": ("Extract every number in the text below and say what it counts, as a list.\n\n{text}",
                   "List the people and objects mentioned in this text: {text}"),
    "coding": ("Write a Python function that computes the answer to: {text}",
               "Write a short program for this problem: {text}"),
    "writing": ("Write a short story that starts like this: {first}",
                "Write a short poem inspired by this sentence: {first}",
                "Write a friendly email about the following situation: {text}"),
    "roleplay": ("Pretend you are a teacher. A student asks: {text}",
                 "You are a shop assistant. A customer says: {first} Reply to them."),
    "qa": ("Answer briefly, in one sentence: what is the topic of this text? {text}",
           "Read this and answer the question at the end in your own words.\n\n{text}"),
}


def first_sentence(text: str) -> str:
    for end in (". ", "? ", "! "):
        if end in text:
            return text.split(end, 1)[0] + end.strip()
    return text


def mixed_prompts(texts: Sequence[str], n: int, seed: int = 0) -> list[dict]:
    """n prompts: source row i (cycling) under a task and template drawn by a seeded RNG."""
    if not texts:
        raise ValueError("mixed_prompts: no source texts")
    rng = random.Random(seed)
    tasks = sorted(TEMPLATES)
    rows = []
    for i in range(n):
        src = i % len(texts)
        task = tasks[rng.randrange(len(tasks))]
        template = TEMPLATES[task][rng.randrange(len(TEMPLATES[task]))]
        text = texts[src].strip()
        rows.append({"prompt": template.format(text=text, first=first_sentence(text)), "task": task,
                     "source_row": src})
    rng.shuffle(rows)
    return rows


def source_texts(path: str | Path, field: str = "question") -> list[str]:
    with open(path) as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def write_prompt_mix(source: str | Path, out: str | Path, n: int, seed: int = 0,
                     field: str = "question") -> Path:
    rows = mixed_prompts(source_texts(source, field), n, seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out
