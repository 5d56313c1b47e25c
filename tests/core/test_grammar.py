"""Grammar masks inside a block (core.grammar) on a tiny vocabulary with real xgrammar matchers."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.grammar import BlockGrammar, mask_logits_, unpack_bitmask

xgr = pytest.importorskip("xgrammar")

VOCAB = [str(d) for d in range(10)] + ["a", "b", "ab", "{", "}", '"', ":", " ", "<eos>"]
EOS = VOCAB.index("<eos>")
V = len(VOCAB)
NB = 6


class Matcher:
    """The duck-typed grammar object core.grammar expects, over a bare xgrammar matcher."""

    def __init__(self, compiled) -> None:  # noqa: ANN001
        self.m = xgr.GrammarMatcher(compiled)
        self.accepted: list[int] = []

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: str) -> torch.Tensor:
        return xgr.allocate_token_bitmask(batch_size, vocab_size)

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        self.m.fill_next_token_bitmask(vocab_mask, idx)

    def accept_token(self, token: int) -> None:
        assert self.m.accept_token(token), f"token {token} refused"
        self.accepted.append(token)

    def rollback(self, k: int) -> None:
        self.m.rollback(k)
        del self.accepted[-k:]

    def is_terminated(self) -> bool:
        return self.m.is_terminated()


@pytest.fixture(scope="module")
def compiler():
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return xgr.GrammarCompiler(info)


def ids(text: list[str]) -> list[int]:
    return [VOCAB.index(t) for t in text]


def reference_mask(compiled, history: list[int]) -> torch.Tensor:
    """A fresh matcher fed ``history`` -> its next-token mask [V] (all allowed once terminated)."""
    m = Matcher(compiled)
    for t in history:
        if m.is_terminated():
            return torch.ones(V, dtype=torch.bool)
        m.accept_token(t)
    if m.is_terminated():
        return torch.ones(V, dtype=torch.bool)
    bm = m.allocate_vocab_mask(V, 1, "cpu")
    m.fill_vocab_mask(bm, 0)
    return unpack_bitmask(bm, V)[0]


def test_unpack_matches_xgrammars_own_masking(compiler) -> None:
    m = Matcher(compiler.compile_regex("[0-9]+a"))
    bm = m.allocate_vocab_mask(V, 1, "cpu")
    m.fill_vocab_mask(bm, 0)
    logits = torch.randn(1, V)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bm)
    assert torch.equal(mask_logits_(logits, unpack_bitmask(bm, V)), want)


def test_masks_along_equal_a_fresh_matchers_and_leave_state_unchanged(compiler) -> None:
    compiled = compiler.compile_regex("[0-9]{2,3}(ab|b)")
    m = Matcher(compiled)
    m.accept_token(VOCAB.index("4"))  # committed history before the block
    block = torch.tensor([[VOCAB.index("4")] + ids(["1", "7", "ab"]) + [EOS, 0]])
    walk = BlockGrammar.of([m], NB, V)
    masks = walk.masks_along(block)
    history = [VOCAB.index("4")]
    drafts = block[0, 1:].tolist()
    for j in range(NB):
        want = reference_mask(compiled, history + drafts[:j])
        assert torch.equal(masks.allowed[0, j], want), f"position {j}"
    assert m.accepted == [VOCAB.index("4")]  # rolled back to where it was
    assert not m.is_terminated()


def test_a_forbidden_draft_ends_the_walk_and_later_positions_stay_open(compiler) -> None:
    m = Matcher(compiler.compile_regex("[0-9]+"))
    block = torch.tensor([[3] + ids(["5", "a", "6", "7", "8"])])  # "a" is forbidden after "5"
    masks = BlockGrammar.of([m], NB, V).masks_along(block)
    digits = torch.zeros(V, dtype=torch.bool)
    digits[:10] = True
    digits_or_eos = digits.clone()
    digits_or_eos[EOS] = True
    assert torch.equal(masks.allowed[0, 0], digits) and torch.equal(masks.allowed[0, 1], digits_or_eos)
    assert masks.allowed[0, 2:].all()  # never committed: verification rejects "a" at position 1
    assert m.accepted == []


def test_termination_mid_block(compiler) -> None:
    m = Matcher(compiler.compile_regex("[0-9]{2}"))
    m.accept_token(1)
    block = torch.tensor([[1, 2, EOS, 4, 5, 6]])  # "12" complete, then EOS terminates the grammar
    masks = BlockGrammar.of([m], NB, V).masks_along(block)
    assert masks.allowed[0, 0, :10].all() and not masks.allowed[0, 0, 10:].any()
    assert masks.allowed[0, 1].nonzero().view(-1).tolist() == [EOS]
    assert masks.allowed[0, 2:].all()
    assert m.accepted == [1] and not m.is_terminated()


def test_unconstrained_and_terminated_rows_are_left_alone(compiler) -> None:
    done = Matcher(compiler.compile_regex("[0-9]"))
    done.accept_token(4)
    done.accept_token(EOS)
    assert done.is_terminated()
    live = Matcher(compiler.compile_regex("a+"))
    walk = BlockGrammar.of([None, done, live], NB, V)
    assert walk is not None and walk.rows == [2]
    assert BlockGrammar.of([None, done], NB, V) is None
    logits = torch.randn(3, NB, V)
    before = logits.clone()
    walk.masks_along(torch.zeros(3, NB, dtype=torch.long)).apply_(logits)
    assert torch.equal(logits[:2], before[:2])
    assert torch.isinf(logits[2, 0, :10]).all()


@pytest.mark.parametrize("seed", range(4))
def test_constrained_drafts_are_always_allowed_and_their_masks_are_the_verifiers(compiler, seed) -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    compiled = compiler.compile_json_schema(schema)
    gen = torch.Generator().manual_seed(seed)
    grammars = [Matcher(compiled), None, Matcher(compiler.compile_regex("(ab|[0-9])+"))]
    logits = torch.randn(3, NB - 1, V, generator=gen)
    free_row = logits[1].clone()
    tokens = torch.zeros(3, NB, dtype=torch.long)

    def choose(j: int, lj: torch.Tensor) -> torch.Tensor:
        tokens[:, j + 1] = lj.argmax(-1)
        return tokens[:, j + 1]

    walk = BlockGrammar.of(grammars, NB, V)
    masks = walk.draft_constrained(logits, choose, to_allowed=lambda a: a)
    for k, row in enumerate(walk.rows):
        history: list[int] = []
        for j in range(NB - 1):
            assert masks.allowed[k, j, tokens[row, j + 1]], f"row {row} drafted a forbidden token at {j}"
            history.append(int(tokens[row, j + 1]))
    again = BlockGrammar.of(grammars, NB, V).masks_along(tokens)
    assert torch.equal(again.allowed, masks.allowed)
    assert torch.equal(logits[1], free_row)  # the unconstrained row drafts as before
    assert grammars[0].accepted == [] and grammars[2].accepted == []
