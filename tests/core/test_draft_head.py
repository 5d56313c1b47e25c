"""The draft head: a subset of the LM head's rows, mapped back to token ids; dtype chosen once."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_sglang.core import draft_head as dh
from dflash_sglang.core.draft_head import DraftHead, load_draft_vocab, save_draft_vocab


def test_subset_head_maps_rows_to_tokens_and_back() -> None:
    lm = torch.randn(10, 4)
    head = DraftHead.build(lm, torch.tensor([2, 5, 9]), torch.float32)
    assert head.size == 3 and torch.equal(head.weight, lm[[2, 5, 9]])
    h = torch.randn(6, 4)
    rows = (h @ head.weight.T).argmax(-1)
    assert set(head.to_tokens(rows).tolist()) <= {2, 5, 9}
    q = torch.softmax(torch.randn(2, 3, 3), -1)
    full = head.full(q)  # [2, 3, 10]: the same mass on the same tokens, zero elsewhere
    assert full.shape == (2, 3, 10) and torch.equal(full[..., [2, 5, 9]], q)
    assert float(full.sum(-1).sub(1).abs().max()) < 1e-6 and full[..., 0].abs().sum() == 0
    idx = head.label_index()
    assert idx.tolist() == [-1, -1, 0, -1, -1, 1, -1, -1, -1, 2]
    with pytest.raises(ValueError, match=">= vocab size"):
        DraftHead.build(lm, torch.tensor([3, 10]))


def test_full_head_is_the_identity_and_follows_in_place_updates() -> None:
    lm = torch.randn(10, 4)
    head = DraftHead.build(lm, None, torch.float32)
    assert head.to_tokens(torch.tensor([7])).tolist() == [7]
    assert head.label_index().tolist() == list(range(10))
    assert head.refreshed(lm) is head
    sub = DraftHead.build(lm, torch.tensor([1, 2]), torch.float32)
    with torch.no_grad():
        lm.mul_(2)  # a weight update in place (SGLang's update_weights)
    assert head.refreshed(lm) is not head and torch.equal(head.refreshed(lm).weight, lm)
    assert torch.equal(sub.refreshed(lm).weight, lm[[1, 2]])


def test_head_dtype_is_bf16_only_with_native_bf16(monkeypatch) -> None:
    lm = torch.randn(10, 4)
    monkeypatch.setattr(dh, "cpu_has_native_bf16", lambda: False)
    assert DraftHead.build(lm).weight.dtype == torch.float32
    monkeypatch.setattr(dh, "cpu_has_native_bf16", lambda: True)
    assert DraftHead.build(lm).weight.dtype == torch.bfloat16
    assert DraftHead.build(lm.double()).weight.dtype == torch.float64  # only fp32 targets get a copy


def test_vocab_file_round_trip_and_errors(tmp_path) -> None:
    assert load_draft_vocab(tmp_path) is None
    save_draft_vocab(tmp_path, torch.tensor([9, 3, 4]), {"note": "x"})
    assert load_draft_vocab(tmp_path).tolist() == [3, 4, 9]
    (tmp_path / dh.VOCAB_FILE).write_text(json.dumps({"token_ids": [1, 1]}))
    with pytest.raises(ValueError, match="repeat"):
        load_draft_vocab(tmp_path)
    (tmp_path / dh.VOCAB_FILE).write_text(json.dumps({"token_ids": []}))
    with pytest.raises(ValueError, match="non-empty"):
        load_draft_vocab(tmp_path)
