"""Blocks anchored in the prompt: labels from one prefill are the target's own greedy continuation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_sglang.train.distill_store import DistillStore
from dflash_sglang.train.loop import TrainConfig
from dflash_sglang.train.prompt_labels import greedy_labels, prompt_greedy
from dflash_sglang.train.recipe import IGNORE, build_batch, sample_anchors

from .tiny import BLOCK, MASK, VOCAB, tiny_model, tiny_samples, tiny_target, tiny_train

META = {"target": "tiny", "target_config_sha256": "a", "target_weights_sha256": "b", "tokenizer_sha256": "c",
        "dtype": "float32", "max_new_tokens": 8, "eos_token_ids": [1], "id_dtype": "uint16"}


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(tiny_model())


def _greedy_continuation(target, prefix: torch.Tensor, n: int) -> list[int]:
    """The target's greedy tokens after ``prefix``, one full forward per token (no cache, no batching)."""
    seq = prefix.tolist()
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(target.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prefix):]


def test_prompt_greedy_is_the_argmax_after_every_prefix(target) -> None:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, VOCAB, (n,), generator=g).numpy() for n in (3, 11, 7, 19, 5)]
    # small groups and head chunks: the right-padded batching and the chunked head must not matter
    got = prompt_greedy(target, prompts, max_tokens=24, head_rows=5)
    with torch.no_grad():
        for p, row in zip(prompts, got, strict=True):
            want = target.model(input_ids=torch.from_numpy(p.astype(np.int64))[None]).logits[0].argmax(-1)
            assert row.tolist() == want.tolist()


def test_prompt_block_labels_are_the_targets_greedy_path_up_to_where_the_text_leaves_it(target) -> None:
    s = tiny_samples(target, n=3, answer=12)[1]
    greedy = torch.from_numpy(prompt_greedy(target, [s.ids[: s.prompt_len].numpy()])[0])
    assert int(greedy[-1]) == int(s.ids[s.prompt_len])  # the prefill's last choice is the first answer token
    label, on = greedy_labels(s.ids, s.prompt_len, greedy)
    assert bool(on[s.prompt_len:].all())  # the answer is the greedy path
    # a prompt that follows the target for a while, then leaves it: the block's labels stop there
    anchor = 2
    follow = _greedy_continuation(target, s.ids[: anchor + 1], 2)
    ids = torch.cat([s.ids[: anchor + 1], torch.tensor(follow), torch.tensor([(follow[1] + 1) % VOCAB or 2]),
                     torch.randint(2, VOCAB, (6,), generator=torch.Generator().manual_seed(0))])
    plen = len(ids) - 2
    greedy = torch.from_numpy(prompt_greedy(target, [ids[:plen].numpy()])[0])
    paths = [greedy_labels(ids, plen, greedy)]
    taps = [torch.zeros(len(ids) - 1, s.taps.shape[-1])]
    b = build_batch([ids], [torch.tensor([anchor])], taps, BLOCK, 1, MASK, paths=paths)
    want = _greedy_continuation(target, ids[: anchor + 1], 3)
    assert b.labels[0, 0].tolist() == want  # the text follows the target for 2 tokens: 3 labels
    b = build_batch([ids], [torch.tensor([anchor + 2])], taps, BLOCK, 1, MASK, paths=paths)
    # at anchor + 3 the text leaves the greedy path: one label (the target's own choice there), then none
    assert b.labels[0, 0].tolist() == _greedy_continuation(target, ids[: anchor + 3], 1) + [IGNORE] * 2


def test_answer_paths_give_the_plain_labels(target) -> None:
    samples = tiny_samples(target, n=2, answer=12)
    anchors = [torch.tensor([s.prompt_len, s.prompt_len + 3]) for s in samples]
    args = ([s.ids for s in samples], anchors, [s.taps.float() for s in samples], BLOCK, 2, MASK)
    plain = build_batch(*args)
    paths = [greedy_labels(s.ids, s.prompt_len, None) for s in samples]
    assert torch.equal(build_batch(*args, paths=paths).labels, plain.labels)
    with pytest.raises(ValueError, match="greedy"):
        greedy_labels(samples[0].ids, samples[0].prompt_len, torch.zeros(2, dtype=torch.long))


def test_prompt_share_of_anchors_lies_in_the_prompt() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = sample_anchors(10, 30, 8, g, prompt_share=0.5)
        assert a.unique().numel() == 8 and a.tolist() == sorted(a.tolist())
        assert int((a < 10).sum()) == 4 and int(a.min()) >= 1 and int(a.max()) <= 28
    # share 0 draws exactly what the response-only sampler draws
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert sample_anchors(10, 30, 8, a, prompt_share=0.0).tolist() == sample_anchors(10, 30, 8, b).tolist()
    assert int((sample_anchors(3, 30, 8, g, prompt_share=1.0) < 3).sum()) == 2  # positions 1, 2 only


def test_store_fills_prompt_labels_once_and_training_samples_carry_them(target, tmp_path: Path) -> None:
    samples = tiny_samples(target, n=5, answer=8)
    store = DistillStore.create_or_open(tmp_path / "s", META)
    for part in (samples[:3], samples[3:]):
        shard = store.append([(s.ids.tolist(), s.prompt_len, 10 + i, i) for i, s in enumerate(part)])
        store.write_taps(shard, target.tap_layer_ids, [s.taps for s in part])
    assert all(x.greedy is None for x in store.training_samples(target.tap_layer_ids))
    log: list[str] = []
    assert store.fill_prompt_greedy(target, log=log.append) == 2
    assert store.fill_prompt_greedy(target) == 0
    assert all("0 rows whose greedy first answer token differs" in m for m in log)
    got = store.training_samples(target.tap_layer_ids)
    for s, x in zip(samples, got, strict=True):
        want = prompt_greedy(target, [s.ids[: s.prompt_len].numpy()])[0]
        assert x.greedy is not None and x.greedy.tolist() == want.tolist()
    np.save(store.greedy_path(store.shard_paths()[0]), np.zeros(2, np.uint16))
    with pytest.raises(ValueError, match="labels for"):
        store.training_samples(target.tap_layer_ids)


def test_training_with_prompt_anchors_uses_prompt_blocks_and_the_share_is_checked(tmp_path: Path) -> None:
    base = tiny_train(tmp_path / "a", steps=3, prompt_labels=True)
    mixed = tiny_train(tmp_path / "b", steps=3, prompt_labels=True, prompt_anchors=0.5)
    unlabelled = tiny_train(tmp_path / "c", steps=3, prompt_anchors=0.5)  # no labels: answers only
    assert all(np.isfinite(h["loss"]) for h in mixed.history)
    assert mixed.history[0]["loss"] != base.history[0]["loss"]  # other blocks, other labels
    assert [h["loss"] for h in unlabelled.history] == [h["loss"] for h in base.history]
    with pytest.raises(ValueError, match="prompt-anchors"):
        TrainConfig(out=str(tmp_path), prompt_anchors=1.5)
