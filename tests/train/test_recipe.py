"""The block-diffusion objective: loss weights, anchors, the block mask, parity with the inference path."""

from __future__ import annotations

import math

import pytest
import torch

from dflash_sglang.core.drafter import ContextKV
from dflash_sglang.train.recipe import (
    IGNORE,
    BlockLoss,
    build_batch,
    default_gamma,
    fresh_positions,
    loss_weights,
    sample_anchors,
    select_draft_vocab,
)

from .tiny import BLOCK, MASK, tiny_drafter, tiny_model, tiny_samples, tiny_target


@pytest.mark.parametrize("block, gamma", [(16, 7.0), (10, 5.0), (8, 4.0)])
def test_loss_weights_formula(block: int, gamma: float) -> None:
    assert default_gamma(block) == gamma
    w = loss_weights(block, gamma)
    assert w.shape == (block - 1,)
    for k in range(1, block):
        assert w[k - 1].item() == pytest.approx(math.exp(-(k - 1) / gamma))


def test_anchors_are_response_positions_with_a_next_token() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = sample_anchors(5, 12, 4, g)
        assert a.numel() == 4 and a.unique().numel() == 4
        assert int(a.min()) >= 5 and int(a.max()) <= 10
    assert sample_anchors(5, 6, 4, g).numel() == 0  # no response token with a successor
    assert sample_anchors(5, 8, 9, g).tolist() == [5, 6]


def _setup() -> tuple[BlockLoss, list, torch.Tensor]:
    torch.manual_seed(0)
    model = tiny_model()
    target = tiny_target(model)
    drafter = tiny_drafter(model).float()
    with torch.no_grad():  # larger weights so that any leak shows up clearly
        for p in drafter.parameters():
            p.add_(0.3 * torch.randn_like(p))
    samples = tiny_samples(target, n=2, answer=24)
    # fp32 head on every CPU (the default is bf16 where the CPU multiplies bf16 natively): exact references
    loss = BlockLoss(drafter, target.embed_weight, target.lm_head_weight, 7.0, torch.float32)
    return loss, samples, target.embed_weight


def _batch(samples: list, anchors: list[torch.Tensor], ids: list | None = None, taps: list | None = None):
    ids = ids or [s.ids for s in samples]
    taps = taps or [s.taps.float() for s in samples]
    return build_batch(ids, anchors, taps, BLOCK, 3, MASK)


def test_fresh_positions_mark_the_start_of_a_loop_and_anchors_avoid_it() -> None:
    ids = torch.tensor([7, 1, 2, 3, 1, 2, 3, 1, 2, 9, 4])
    fresh = fresh_positions(ids, window=2)
    # windows (1,2) at 4 and 7, (2,3) at 5, (3,1) at 6 repeat earlier ones; (1,2) at 7 again
    assert fresh.tolist() == [True, True, True, True, False, False, False, False, True, True, True]
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = sample_anchors(1, len(ids), 4, g, allowed=fresh)
        assert bool(fresh[a].all()) and a.numel() == 4
    assert sample_anchors(1, len(ids), 20, g, allowed=fresh).tolist() == [1, 2, 3, 8, 9]


def test_labels_are_the_next_tokens() -> None:
    _, samples, _ = _setup()
    s = samples[0]
    n = len(s.ids)
    anchors = [torch.tensor([s.prompt_len, n - 3]), torch.tensor([samples[1].prompt_len])]
    b = _batch(samples, anchors)
    assert b.labels[0, 0].tolist() == s.ids[s.prompt_len + 1: s.prompt_len + BLOCK].tolist()
    assert b.labels[0, 1].tolist() == [int(s.ids[n - 2]), int(s.ids[n - 1]), IGNORE]  # runs off the end
    assert (b.labels[0, 2] == IGNORE).all() and (b.labels[1, 1:] == IGNORE).all()  # padding blocks
    assert b.block_ids[0, :BLOCK].tolist() == [int(s.ids[s.prompt_len])] + [MASK] * (BLOCK - 1)


def test_block_sees_only_its_past_and_its_own_block() -> None:
    """Perturbing everything at or after anchor_0 (context features and other blocks' tokens) leaves
    block 0's hidden states and loss unchanged, while a later block does change."""
    loss, samples, _ = _setup()
    s = samples[0]
    a0, a1 = s.prompt_len + 2, s.prompt_len + 9
    anchors = [torch.tensor([a0, a1]), torch.tensor([samples[1].prompt_len + 1])]
    base = _batch(samples, anchors)
    ids = [s.ids.clone(), samples[1].ids]
    ids[0][a0 + 1:] = torch.randint(2, 64, (len(s.ids) - a0 - 1,))
    taps = [s.taps.float().clone(), samples[1].taps.float()]
    taps[0][a0:] = torch.randn_like(taps[0][a0:])
    moved = _batch(samples, anchors, ids, taps)
    with torch.no_grad():
        h0, h1 = loss.hidden(base), loss.hidden(moved)
        blk = slice(0, BLOCK)
        torch.testing.assert_close(h0[0, blk], h1[0, blk], rtol=0, atol=1e-6)
        assert not torch.allclose(h0[0, BLOCK: 2 * BLOCK], h1[0, BLOCK: 2 * BLOCK], atol=1e-3)
        torch.testing.assert_close(h0[1], h1[1], rtol=0, atol=1e-6)  # other sequence untouched
        one = [torch.tensor([a0]), anchors[1]]
        l_base = loss(build_batch([s.ids, samples[1].ids], one, [s.taps.float(), samples[1].taps.float()],
                                  BLOCK, 1, MASK)).loss
        l_moved = loss(build_batch([s.ids[: a0 + BLOCK].clone(), samples[1].ids], one,
                                   [taps[0][:a0].clone(), samples[1].taps.float()], BLOCK, 1, MASK)).loss
        # same labels, context truncated at the anchor: the loss of the block cannot move
        torch.testing.assert_close(l_base, l_moved, rtol=0, atol=1e-6)


def test_training_forward_matches_inference_forward() -> None:
    """Each block's hidden states equal DFlashDrafter.forward_block with context = positions < anchor."""
    loss, samples, embed = _setup()
    s = samples[0]
    anchors = [torch.tensor([s.prompt_len, s.prompt_len + 5, s.prompt_len + 11]),
               torch.tensor([samples[1].prompt_len + 3])]
    b = _batch(samples, anchors)
    d = loss.drafter
    with torch.no_grad():
        h = loss.hidden(b)
        for j, a in enumerate(anchors[0].tolist()):
            ctx_pos = torch.arange(a)[None]
            k, v = d.context_kv(s.taps.float()[None, :a], ctx_pos)
            ctx = ContextKV(k, v, ctx_pos, torch.ones(1, a, dtype=torch.bool))
            blk = b.block_ids[:1, j * BLOCK: (j + 1) * BLOCK]
            emb = torch.nn.functional.embedding(blk, embed)
            want = d.forward_block(emb, a + torch.arange(BLOCK)[None], ctx)
            torch.testing.assert_close(h[:1, j * BLOCK: (j + 1) * BLOCK], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("known", [1, 2])
def test_predraft_blocks_are_what_the_engine_predrafts(known: int) -> None:
    """A training block with ``known`` j known tokens is the reference engine's pre-draft input for a
    verify outcome of accept length j - 1 (core.predraft.predraft_block, unpadded), its hidden states at
    the drafted positions equal forward_block on that input with context < anchor, and its labels are
    the B-1 tokens after the known ones."""
    from dflash_sglang.core.predraft import OutcomeGuess, predraft_block

    loss, samples, embed = _setup()
    s = samples[0]
    a = s.prompt_len + 4
    b = build_batch([s.ids], [torch.tensor([a])], [s.taps.float()], BLOCK, 1, MASK, known=known)
    assert b.known == known and b.block_ids.shape == (1, BLOCK + known)
    block_n = s.ids[a: a + BLOCK][None]  # block n: its first token, then drafts equal to the target's tokens
    guess = OutcomeGuess(torch.tensor([[known - 1]]), s.ids[a + known].view(1, 1), torch.ones(1, 1))
    inp = predraft_block(block_n, torch.tensor([a]), guess, MASK)
    n = BLOCK + known
    assert inp.tokens[0, :n].tolist() == b.block_ids[0].tolist()
    assert inp.positions[0, :n].tolist() == b.block_pos[0].tolist()
    assert b.labels[0, 0].tolist() == s.ids[a + known + 1: a + known + BLOCK].tolist()
    d = loss.drafter
    with torch.no_grad():
        ctx_pos = torch.arange(a)[None]
        k, v = d.context_kv(s.taps.float()[None, :a], ctx_pos)
        ctx = ContextKV(k, v, ctx_pos, torch.ones(1, a, dtype=torch.bool))
        want = d.forward_block(torch.nn.functional.embedding(b.block_ids, embed), b.block_pos, ctx)
        torch.testing.assert_close(b.drafted(loss.hidden(b))[0, 0], want[0, known + 1:], rtol=1e-5, atol=1e-5)
        assert torch.isfinite(loss(b).loss)


def test_loss_is_the_weighted_cross_entropy() -> None:
    loss, samples, _ = _setup()
    anchors = [torch.tensor([samples[0].prompt_len + 1]), torch.tensor([samples[1].prompt_len])]
    b = _batch(samples, anchors)
    with torch.no_grad():
        out = loss(b)
        h = loss.hidden(b).view(2, 3, BLOCK, -1)[:, :1, 1:]  # first (only real) block of each sequence
        logits = loss.drafter.logits(h, loss.head.weight)
        labels = b.labels[:, :1].flatten()
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), labels, reduction="none")
        w = loss_weights(BLOCK, 7.0).repeat(2)
        torch.testing.assert_close(out.loss, (w * ce).sum() / w.sum())


def test_soft_labels_are_the_targets_distribution_where_it_predicted_each_label() -> None:
    """With soft_alpha 1 the loss is the weighted cross-entropy to the target's own next-token
    distribution at position anchor + k - 1 (the position whose output is label k), over its logits."""
    from dflash_sglang.train.teacher import TopLayersTeacher

    loss, samples, _ = _setup()
    model = tiny_model()
    teacher = TopLayersTeacher(model, loss.drafter.cfg.target_layer_ids)
    soft = BlockLoss(loss.drafter, model.get_input_embeddings().weight, model.get_output_embeddings().weight,
                     7.0, torch.float32, teacher=teacher, soft_alpha=1.0)
    anchors = [torch.tensor([samples[0].prompt_len + 1]), torch.tensor([samples[1].prompt_len])]
    b = _batch(samples, anchors)
    with torch.no_grad():
        out = soft(b)
        h = soft.hidden(b).view(2, 3, BLOCK, -1)[:, :1, 1:]
        logits = soft.drafter.logits(h, soft.head.weight).flatten(0, 2)  # [2 * (B-1), V]
        t_h = teacher(b.taps)
        pos = torch.stack([a[0] + torch.arange(BLOCK - 1) for a in anchors])  # [2, B-1]
        t_logits = t_h[torch.arange(2)[:, None], pos] @ model.get_output_embeddings().weight.T
        assert torch.equal(t_logits.argmax(-1).flatten(), b.labels[:, 0].flatten())  # greedy answers
        ce = torch.nn.functional.cross_entropy(logits, torch.softmax(t_logits.flatten(0, 1), -1),
                                               reduction="none")
        w = loss_weights(BLOCK, 7.0).repeat(2)
        torch.testing.assert_close(out.loss, (w * ce).sum() / w.sum())
        assert not torch.allclose(out.loss, loss(b).loss)


def test_loss_over_a_draft_vocabulary_leaves_out_what_cannot_be_drafted() -> None:
    """With a draft vocabulary the loss is the weighted CE over its rows at the positions whose label is
    in it; a label outside it is no loss term and always a miss."""
    loss, samples, _ = _setup()
    anchors = [torch.tensor([samples[0].prompt_len + 1]), torch.tensor([samples[1].prompt_len])]
    b = _batch(samples, anchors)
    labels = b.labels[:, :1].flatten()  # [2 * (B-1)]
    vocab = labels.unique()[::2]  # about half the label tokens (and few others)
    loss.drafter.draft_vocab = vocab
    sub = BlockLoss(loss.drafter, loss.embed_weight, loss.head.weight, 7.0, torch.float32)
    loss.drafter.draft_vocab = None
    assert sub.head.size == len(vocab)
    with torch.no_grad():
        out = sub(b)
        h = sub.hidden(b).view(2, 3, BLOCK, -1)[:, :1, 1:].flatten(0, 2)
        inside = torch.isin(labels, vocab)
        assert 0 < int(inside.sum()) < len(labels)
        logits = sub.drafter.logits(h[inside], sub.head.weight)
        rows = torch.searchsorted(vocab, labels[inside])
        ce = torch.nn.functional.cross_entropy(logits, rows, reduction="none")
        w = loss_weights(BLOCK, 7.0).repeat(2)[inside]
        torch.testing.assert_close(out.loss, (w * ce).sum() / w.sum())
        assert not out.correct[:, :1].flatten()[~inside].any()


def test_train_vocabulary_adds_the_batch_labels_so_none_is_dropped() -> None:
    """A sampled softmax: the CE over (frequent tokens + every label of the batch), every label a term;
    draft_hits still score with the drafter's own (full) head."""
    loss, samples, _ = _setup()
    anchors = [torch.tensor([samples[0].prompt_len + 1]), torch.tensor([samples[1].prompt_len])]
    b = _batch(samples, anchors)
    labels = b.labels[:, :1].flatten()
    frequent = torch.tensor([0, 1, 2, 3])
    sub = BlockLoss(loss.drafter, loss.embed_weight, loss.head.weight, 7.0, torch.float32,
                    train_vocab=frequent)
    with torch.no_grad():
        out = sub(b)
        rows = torch.cat([frequent, labels]).unique()
        h = sub.hidden(b).view(2, 3, BLOCK, -1)[:, :1, 1:].flatten(0, 2)
        logits = sub.drafter.logits(h, loss.head.weight[rows])
        ce = torch.nn.functional.cross_entropy(logits, torch.searchsorted(rows, labels), reduction="none")
        w = loss_weights(BLOCK, 7.0).repeat(2)
        torch.testing.assert_close(out.loss, (w * ce).sum() / w.sum())
        hits, valid = sub.draft_hits(b)
        full = sub.drafter.logits(h, loss.head.weight).argmax(-1) == labels
        assert torch.equal(hits[:, :1].flatten(), full) and valid[:, :1].all()


def test_draft_vocabulary_is_the_most_frequent_answer_tokens() -> None:
    answers = [torch.tensor([5, 5, 5, 2, 2, 9]), torch.tensor([2, 7, 7, 7, 7])]
    ids, cover = select_draft_vocab(answers, 2, 12)
    assert ids.tolist() == [2, 7] and cover == 7 / 11  # 7 (4x), then 2 and 5 (3x each): the lower id
    ids, cover = select_draft_vocab(answers, 2, 12, always=(9,))  # EOS-like ids always kept
    assert ids.tolist() == [7, 9] and cover == 5 / 11
