"""Greedy accept kernel vs reference, and the reference vs core.verify.greedy_verify."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_test_helpers import gen

from dflash_sglang.core.kernel_ref import greedy_accept_ref
from dflash_sglang.core.verify import PAD_TOKEN, VerifyResult, greedy_verify
from dflash_sglang.kernels import greedy_accept

REPO = Path(__file__).resolve().parents[2]


def _batch(bs: int, block: int, vocab: int, seed: int, match: float = 0.8):
    """Blocks whose drafts agree with the target argmax with probability `match` per position."""
    g = gen(seed)
    logits = torch.randn(bs, block, vocab, generator=g)
    ids = logits.argmax(-1)
    drafts = torch.randint(0, vocab, (bs, block - 1), generator=g)
    agree = torch.rand(bs, block - 1, generator=g) < match
    block_tokens = torch.cat(
        [torch.randint(0, vocab, (bs, 1), generator=g), torch.where(agree, ids[:, :-1], drafts)], dim=1
    )
    valid = torch.randint(1, block + 1, (bs,), generator=g)
    return block_tokens, logits, ids, valid


def _equal(a: VerifyResult, b: VerifyResult) -> None:
    for name in ("accept_len", "bonus", "committed", "num_committed"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == torch.int64 and torch.equal(x, y), (name, x, y)


@pytest.mark.parametrize("bs,block,vocab", [(1, 1, 5), (3, 2, 7), (9, 16, 50), (17, 5, 3)])
def test_reference_equals_greedy_verify(bs: int, block: int, vocab: int) -> None:
    for seed in range(3):
        block_tokens, logits, ids, _ = _batch(bs, block, vocab, seed)
        _equal(greedy_accept_ref(block_tokens, ids), greedy_verify(block_tokens, logits))


def test_reference_ragged_equals_truncated_greedy_verify() -> None:
    block_tokens, logits, ids, valid = _batch(12, 6, 9, seed=5)
    valid[0], valid[1] = 1, 6
    got = greedy_accept_ref(block_tokens, ids, valid)
    for b in range(12):
        n = int(valid[b])
        want = greedy_verify(block_tokens[b : b + 1, :n], logits[b : b + 1, :n])
        pad = torch.full((1, 6 - n), PAD_TOKEN, dtype=torch.int64)
        assert torch.equal(got.committed[b : b + 1], torch.cat([want.committed, pad], dim=1))
        assert int(got.accept_len[b]) == int(want.accept_len[0]) and int(got.bonus[b]) == int(want.bonus[0])


@pytest.mark.parametrize("bs,block,vocab", [(1, 1, 5), (4, 2, 7), (7, 16, 50), (5, 5, 3), (3, 11, 30)])
@pytest.mark.parametrize("ragged", [False, True])
def test_kernel_equals_reference(bs: int, block: int, vocab: int, ragged: bool) -> None:
    block_tokens, _, ids, valid = _batch(bs, block, vocab, seed=bs + block)
    vl = valid if ragged else None
    _equal(greedy_accept(block_tokens, ids, vl), greedy_accept_ref(block_tokens, ids, vl))


def test_kernel_logits_input_int32_strided_and_clamped_valid_len() -> None:
    block_tokens, logits, ids, _ = _batch(6, 8, 20, seed=11)
    wide = torch.zeros(6, 16, dtype=torch.int32)
    wide[:, ::2] = block_tokens.int()
    strided = wide[:, ::2]  # column stride 2
    valid = torch.tensor([0, 1, 3, 8, 9, -4], dtype=torch.int32)  # out-of-range values clamp to [1, B]
    want = greedy_accept_ref(block_tokens, ids, valid)
    _equal(greedy_accept(strided, logits, valid), want)
    _equal(greedy_accept(block_tokens, logits), greedy_verify(block_tokens, logits))


def test_kernel_empty_batch() -> None:
    res = greedy_accept(torch.zeros(0, 4, dtype=torch.int64), torch.zeros(0, 4, dtype=torch.int64))
    assert res.committed.shape == (0, 4)


I64 = torch.int64


def _z(*shape: int, dtype: torch.dtype = I64, device: str = "cpu") -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "block,target,valid,match",
    [
        (_z(4), _z(4, 1), None, r"block_tokens must be \[bs, B\]"),
        (_z(2, 4, dtype=torch.float32), _z(2, 4), None, "block_tokens must be int32/int64"),
        (_z(2, 4), _z(2, 3), None, r"target ids must be \[bs, B\]"),
        (_z(2, 4), _z(2, 4, dtype=torch.float32), None, "target ids must be int32/int64"),
        (_z(2, 4), _z(2, 3, 9, dtype=torch.float32), None, r"target logits must be \[bs, B, V\]"),
        (_z(2, 4), _z(2, 4, 9), None, "target logits must be float32/float16/bfloat16"),
        (_z(2, 4), _z(2, 4), _z(3), r"valid_len must be \[bs\]"),
        (_z(2, 4), _z(2, 4), _z(2, dtype=torch.float32), "valid_len must be int32/int64"),
        (_z(2, 4), _z(2, 4, device="meta"), None, "all tensors must be on one device"),
    ],
)
def test_wrapper_rejects_bad_arguments(block, target, valid, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        greedy_accept(block, target, valid)
    assert "\n" not in str(err.value)


def test_cpu_tensors_without_interpreter_are_refused() -> None:
    """Compiled (non-interpreted) kernels get a clear error for CPU tensors instead of a crash."""
    code = (
        "import torch, dflash_sglang.kernels as kernels\n"
        "z = torch.zeros(1, 2, dtype=torch.int64)\n"
        "try:\n"
        "    kernels.greedy_accept(z, z)\n"
        "except ValueError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "ERR greedy_accept: CPU tensors need TRITON_INTERPRET=1" in out.stdout, out.stdout + out.stderr
