"""Fixtures for core tests: the real SmolLM2 target, random drafters, Spec-Bench prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_sglang.core.drafter import DFlashDrafter
from dflash_sglang.core.random_drafter import build_random_drafter
from dflash_sglang.core.target import load_hf_target
from dflash_sglang.models import fetch_model
from dflash_sglang.prompts import chat_ids, load_prompts, spec_bench_path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return fetch_model("smollm2-135m", log=lambda _m: None)


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path):
    torch.set_num_threads(2)
    return load_hf_target(str(smollm2_path))


@pytest.fixture(scope="session")
def random_drafter_16(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> DFlashDrafter:
    out = build_random_drafter(smollm2_path, tmp_path_factory.mktemp("drafter") / "d16", block_size=16)
    return DFlashDrafter.from_pretrained(out)


@pytest.fixture(scope="session")
def spec_bench_ids(smollm2) -> list[list[int]]:
    """Chat-templated token ids of the first 24 Spec-Bench first turns (one per category first)."""
    _, tok = smollm2
    prompts = load_prompts(spec_bench_path())
    seen: dict[str, int] = {}
    picked = []
    for p in prompts:  # round-robin over categories for variety
        if seen.get(p.category, 0) < 3:
            seen[p.category] = seen.get(p.category, 0) + 1
            picked.append(p)
    return [chat_ids(tok, p.text) for p in picked[:24]]
