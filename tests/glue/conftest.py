"""Fixtures for the SGLang glue: the default drafter and chat-templated Spec-Bench prompt ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_sglang.core.random_drafter import build_random_drafter
from dflash_sglang.models import fetch_model

TRAINED = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash-b16"


@pytest.fixture(scope="session")
def target_path() -> Path:
    return fetch_model("smollm2-135m", log=lambda _m: None)


@pytest.fixture(scope="session")
def drafter_path(target_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped trained drafter when present, else a random one (lossless either way)."""
    if (TRAINED / "config.json").is_file():
        return TRAINED
    return build_random_drafter(target_path, tmp_path_factory.mktemp("drafter") / "rand16", block_size=16)


@pytest.fixture(scope="session")
def prompt_ids(target_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    from dflash_sglang.prompts import chat_ids, load_prompts, spec_bench_path

    tok = AutoTokenizer.from_pretrained(str(target_path))
    prompts = load_prompts(spec_bench_path())
    picked, per_cat = [], {}
    for p in prompts:  # a spread of categories
        if per_cat.get(p.category, 0) < 2:
            per_cat[p.category] = per_cat.get(p.category, 0) + 1
            picked.append(p)
    return [chat_ids(tok, p.text) for p in picked[:16]]
