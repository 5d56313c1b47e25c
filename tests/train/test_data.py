"""Self-distillation data: greedy answers, captured tap features, the resumable shard cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_sglang.core.engine import autoregressive_generate
from dflash_sglang.core.sampling import SamplingConfig
from dflash_sglang.train import data
from dflash_sglang.train.data import GenSettings, build_dataset, online_taps

from .tiny import tiny_model, tiny_prompts, tiny_target


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(tiny_model())


def test_answers_are_the_targets_greedy_continuations(target) -> None:
    prompts = tiny_prompts(5)
    s = GenSettings(12, 8, (7,), target.tap_layer_ids, True)
    got = data.answer_batch(target, prompts, s)
    for p, q in zip(prompts, got, strict=True):
        want = autoregressive_generate(target, [p], 12, (7,), SamplingConfig.uniform(1, 0.0, 0, 1.0))[0]
        assert q.prompt_len == len(p) and q.ids[: len(p)].tolist() == p
        assert q.ids[len(p):].tolist() == want
        assert q.taps.shape == (len(q.ids) - 1, len(target.tap_layer_ids) * 32)
        assert q.taps.dtype == torch.bfloat16


def test_captured_taps_match_a_fresh_forward(target) -> None:
    """Tap features captured while decoding (left-padded, KV-cached) equal a plain forward pass."""
    got = data.answer_batch(target, tiny_prompts(4), GenSettings(10, 8, (), target.tap_layer_ids, True))
    fresh = online_taps(target, got)
    for q, f in zip(got, fresh, strict=True):
        torch.testing.assert_close(q.taps.float(), f.to(torch.bfloat16).float(), rtol=2e-2, atol=2e-2)


def test_cache_resumes_and_is_reused(target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = tiny_prompts(7)
    s = GenSettings(6, 3, (), target.tap_layer_ids, True)
    first = build_dataset(target, prompts[:5], tmp_path, s, show=False)  # shards of 3 + 2 rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_00000_3.pt", "shard_00001_2.pt"]
    calls: list[int] = []
    real = data.answer_batch
    monkeypatch.setattr(data, "answer_batch", lambda t, p, st: calls.append(len(p)) or real(t, p, st))
    again = build_dataset(target, prompts, tmp_path, s, show=False)  # 7 prompts: shard 0 reused
    assert calls == [3, 1]
    assert len(again) == 7
    for a, b in zip(first[:3], again[:3], strict=True):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.taps, b.taps)


def test_cache_key_depends_on_settings(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\n')
    a = data.cache_key("t", [f], GenSettings(10, 4, (2,), (1, 2), True))
    assert a == data.cache_key("t", [f], GenSettings(10, 4, (2,), (1, 2), True))
    assert a != data.cache_key("t", [f], GenSettings(11, 4, (2,), (1, 2), True))
    assert a != data.cache_key("u", [f], GenSettings(10, 4, (2,), (1, 2), True))
    assert a != data.cache_key("t", [f], GenSettings(10, 4, (2,), (1, 2), True, "bfloat16"))  # answerer dtype


def test_padded_groups_keep_the_padded_size_within_the_budget() -> None:
    # sorted by length: 1 (idx 1), 2 (idx 4), 3 (idx 2), 5 (idx 0), 9 (idx 3); 9 > 6 still gets a group
    assert data.padded_groups([5, 1, 3, 9, 2], 6) == [[1, 4], [2], [0], [3]]
    assert data.padded_groups([2, 2, 2], 6) == [[0, 1, 2]] and data.padded_groups([], 6) == []
