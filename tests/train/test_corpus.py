"""The training data pipeline: dedup, corpus rows and split, the distill store, distillation that extends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_sglang.prompts import shared_data_dir
from dflash_sglang.train.corpus import build_rows, load_corpus, split_of, write_jsonl_gz
from dflash_sglang.train.corpus_sources import SOURCES, gsm8k_units
from dflash_sglang.train.corpus_templates import TASKS
from dflash_sglang.train.data import GenSettings, answer_batch
from dflash_sglang.train.dedup import dedup
from dflash_sglang.train.distill import distill_into, length_grouped, pending, stratified_order
from dflash_sglang.train.distill_store import DistillStore, pack_rows, prompt_key, recompute_taps

from .tiny import EOS, VOCAB, tiny_model, tiny_prompts, tiny_target

TEXT = ("The quick brown fox jumps over the lazy dog while the farmer watches from the porch and the "
        "sun sets slowly behind the hills of the quiet valley below.")


def test_dedup_removes_exact_and_near_duplicates_first_occurrence_wins() -> None:
    near = TEXT.replace("slowly", "very slowly")  # one word changed: Jaccard of 5-shingles stays high
    other = "A completely different sentence about compilers, registers and instruction scheduling."
    texts = [TEXT, other, TEXT.upper() + "!!", near, other + " "]
    r = dedup(texts)
    assert r.keep == [0, 1]
    assert sorted(r.exact) == [2, 4]
    assert r.near == [3]


def test_dedup_keeps_texts_that_merely_share_words() -> None:
    words = TEXT.split()
    shuffled = " ".join(reversed(words))  # same words, no shared 5-word window
    assert dedup([TEXT, shuffled]).keep == [0, 1]


def test_rows_are_split_by_document_and_deterministic() -> None:
    gsm = list(gsm8k_units(shared_data_dir() / "gsm8k_train.jsonl"))[:400]
    by_source = {"gsm8k-train": gsm}
    plan = {"gsm8k-train": (300, 1)}
    rows, stats = build_rows(by_source, 0, plan, heldout_percent=20)
    again, _ = build_rows(by_source, 0, plan, heldout_percent=20)
    assert [r.json() for r in rows] == [r.json() for r in again]
    assert stats["gsm8k-train"].units_used == 300 and len(rows) == 300
    split_by_doc: dict[str, set[str]] = {}
    for r in rows:
        split_by_doc.setdefault(r.doc, set()).add(r.split)
        assert r.split == split_of(r.doc, 20) and r.task in TASKS
    assert all(len(s) == 1 for s in split_by_doc.values())
    assert {"train", "heldout"} == {r.split for r in rows}


def test_every_source_is_a_known_non_evaluation_package() -> None:
    names = {s.name for s in SOURCES}
    assert {"manpages-de", "manpages-fr", "manpages-es", "python3-doc", "wordnet-base",
            "debian-reference-en", "python-stdlib", "gsm8k-train"} == names
    banned = ("spec", "mt-bench", "mt_bench", "humaneval", "ifeval", "math500", "gsm8k-test")
    assert not any(b in n.lower() for n in names for b in banned)


def test_corpus_files_round_trip(tmp_path: Path) -> None:
    rows = [{"prompt": f"p{i}", "task": "qa", "split": "train"} for i in range(5)]
    path = tmp_path / "c.jsonl.gz"
    write_jsonl_gz(path, (json.dumps(r) for r in rows))
    first = path.read_bytes()
    write_jsonl_gz(path, (json.dumps(r) for r in rows))
    assert path.read_bytes() == first  # deterministic gzip: the same rows give the same bytes
    assert load_corpus(path) == rows


def test_stratified_order_keeps_task_proportions() -> None:
    tasks = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    order = stratified_order(tasks)
    assert sorted(order) == list(range(100))
    first = [tasks[i] for i in order[:20]]
    assert (first.count("a"), first.count("b"), first.count("c")) == (12, 6, 2)


def test_length_grouping_sorts_within_groups_only() -> None:
    lengths = [5, 1, 4, 2, 9, 3, 7]
    assert length_grouped([0, 1, 2, 3, 4, 5, 6], lengths, 3) == [1, 2, 0, 3, 5, 4, 6]
    assert length_grouped([6, 0], lengths, 10) == [0, 6]


# ------------------------------------------------------------------------------------ distill store
META = {"target_config_sha256": "c", "target_weights_sha256": "w", "tokenizer_sha256": "t",
        "dtype": "float32", "max_new_tokens": 8, "eos_token_ids": [EOS], "id_dtype": "uint16"}


def test_store_round_trips_rows_and_refuses_other_settings(tmp_path: Path) -> None:
    store = DistillStore.create_or_open(tmp_path / "s", META)
    store.append([([5, 6, 7, 8], 2, 11, 0), ([9, 65535], 1, 12, 3)])
    store.append([([1, 2, 3], 3, 13, 4)])
    got = DistillStore.open(tmp_path / "s").samples()
    assert [(s.ids.tolist(), s.prompt_len, s.key, s.row) for s in got] == [
        ([5, 6, 7, 8], 2, 11, 0), ([9, 65535], 1, 12, 3), ([1, 2, 3], 3, 13, 4)]
    assert got[0].ids.dtype == np.uint16
    assert store.keys() == {11, 12, 13}
    assert store.stats() == {"shards": 2, "sequences": 3, "tokens": 9, "answer_tokens": 3}
    with pytest.raises(SystemExit, match="dtype"):
        DistillStore.create_or_open(tmp_path / "s", {**META, "dtype": "bfloat16"})
    with pytest.raises(ValueError, match="uint16"):
        pack_rows([([70000], 1, 1, 1)], np.dtype("uint16"))
    with pytest.raises(ValueError, match="prompt_len"):
        pack_rows([([1, 2], 0, 1, 1)], np.dtype("uint16"))


def test_distill_extends_the_store_and_taps_are_recomputed_from_ids(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    target = tiny_target(tiny_model())
    prompts = tiny_prompts(6)
    rows = [{"prompt": " ".join(map(str, p)), "task": "qa" if i % 2 else "math", "split": "train"}
            for i, p in enumerate(prompts)] + [{"prompt": "1 2 3", "task": "qa", "split": "heldout"}]
    tokenize = lambda text: [int(t) for t in text.split()]  # noqa: E731
    s = GenSettings(6, 2, (EOS,), target.tap_layer_ids, store_taps=True)
    store = DistillStore.create_or_open(tmp_path / "s", {**META, "max_new_tokens": 6})
    log: list[str] = []

    first = pending(rows, store.keys(), limit=4)
    assert len(first) == 4 and all(rows[t.row]["split"] == "train" for t in first)
    distill_into(store, target, tokenize, first, s, 2, log.append)
    assert store.stats() == {"shards": 2, "sequences": 4, "tokens": store.stats()["tokens"],
                             "answer_tokens": store.stats()["answer_tokens"]}
    rest = pending(rows, store.keys(), limit=None)  # a rerun with a larger limit only answers the rest
    assert {t.row for t in rest} == set(range(6)) - {t.row for t in first}
    distill_into(store, target, tokenize, rest, s, 1, log.append)
    assert pending(rows, store.keys(), limit=None) == []
    assert len(list(store.taps_dir(target.tap_layer_ids).glob("*.npy"))) == 4  # one per shard

    samples = store.samples()
    assert sorted(x.row for x in samples) == list(range(6))
    want = {prompt_key(rows[i]["prompt"]): q for i, q in enumerate(answer_batch(target, prompts, s))}
    for x in samples:
        ref = want[x.key]
        assert x.ids.tolist() == ref.ids.tolist() and x.prompt_len == ref.prompt_len
        assert max(x.ids.tolist()) < VOCAB
    taps = recompute_taps(target, samples)  # one batched prefill over the stored ids, no decode loop
    for x, t in zip(samples, taps, strict=True):
        # the generation run kept bf16 taps; the recomputed ones agree to bf16 precision
        torch.testing.assert_close(t.float(), want[x.key].taps.float(), atol=2e-2, rtol=2e-2)
    # the generator's cached taps are those of the stored ids; fill_taps rebuilds them from the ids alone
    cached = store.training_samples(target.tap_layer_ids)
    shutil.rmtree(store.taps_dir(target.tap_layer_ids))
    with pytest.raises(FileNotFoundError, match="fill_taps"):
        store.training_samples(target.tap_layer_ids)
    assert store.fill_taps(target, max_tokens=20) == 4
    rebuilt = store.training_samples(target.tap_layer_ids)
    for x, c, r in zip(samples, cached, rebuilt, strict=True):
        assert c.ids.tolist() == r.ids.tolist() == x.ids.tolist()
        assert c.taps.shape == r.taps.shape == (len(x.ids) - 1, want[x.key].taps.shape[-1])
        torch.testing.assert_close(c.taps.float(), want[x.key].taps.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(r.taps.float(), want[x.key].taps.float(), atol=2e-2, rtol=2e-2)
