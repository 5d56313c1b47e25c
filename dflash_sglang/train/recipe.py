"""The DFlash training objective on a batch of sequences.

Per sequence, K anchor positions are drawn from the response tokens. Block j is
``[token at anchor_j, mask x (B-1)]`` at positions ``anchor_j .. anchor_j + B - 1``; it sees the context
K/V of positions ``< anchor_j`` of its own sequence (computed once per sequence and layer, shared by all
its blocks) and, bidirectionally, its own block, nothing else. The loss is cross-entropy at block
positions 1..B-1 against the tokens at ``anchor_j + 1 .. anchor_j + B - 1``, weighted exp(-(k-1)/gamma).

Pre-draft blocks (issue #20, ``known`` = j > 0): ``[tokens at anchor_j .. anchor_j + j, mask x (B-1)]``,
j + B long, the same context (positions < anchor_j): the first j + 1 tokens are known but have no target
features, as when block n+1 is drafted before verify(n) has run (core.predraft). Labels are the B-1
tokens after them. j = 0 is the ordinary block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.draft_head import DraftHead
from ..core.drafter import DFlashDrafter
from .block_attention import block_attention
from .fused_ce import fused_weighted_ce
from .teacher import TopLayersTeacher

DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
IGNORE = -100


def default_gamma(block_size: int) -> float:
    return DEFAULT_GAMMA.get(block_size, max(1.0, (block_size - 1) / 2))


def loss_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B-1]: weight of block position k = 1..B-1 is exp(-(k - 1) / gamma)."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


@dataclass(frozen=True)
class BlockBatch:
    taps: torch.Tensor  # [S, L, T*H] context features of positions 0..L-1
    block_ids: torch.Tensor  # [S, K*(B+j)] anchor token, j known tokens, then B-1 mask tokens
    block_pos: torch.Tensor  # [S, K*(B+j)] absolute positions
    labels: torch.Tensor  # [S, K, B-1] next tokens; IGNORE past the sequence end / padding blocks
    ctx_len: torch.Tensor  # [S, K] block j sees context positions < ctx_len (its anchor; 0: padding block)

    def to(self, device: torch.device | str) -> BlockBatch:
        return BlockBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))

    @property
    def known(self) -> int:
        """j: known tokens after each anchor token (0: ordinary blocks; > 0: pre-draft blocks)."""
        s, k, nb1 = self.labels.shape
        return self.block_ids.shape[1] // k - nb1 - 1 if k else 0

    def drafted(self, per_position: torch.Tensor) -> torch.Tensor:
        """[S, K*(B+j), ...] block-position tensor -> [S, K, B-1, ...] at the positions that draft."""
        s, k, nb1 = self.labels.shape
        j = self.known
        return per_position.view(s, k, nb1 + 1 + j, *per_position.shape[2:])[:, :, 1 + j:]


def sample_anchors(prompt_len: int, n: int, k: int, gen: torch.Generator,
                   allowed: torch.Tensor | None = None, prompt_share: float = 0.0) -> torch.Tensor:
    """Up to k distinct sorted anchors among response positions prompt_len .. n-2 (each has a next
    token); ``allowed`` [n] bool, if given, further restricts them (see :func:`fresh_positions`).
    ``prompt_share``: round(share * k) of them among prompt positions 1 .. prompt_len - 1 instead
    (blocks labelled by the target's greedy tokens, train.prompt_labels), the rest in the response.
    With share 0 the draws are those of the response-only sampler."""
    kp = round(prompt_share * k)
    head = _pick(1, prompt_len, kp, gen, allowed) if kp else torch.zeros(0, dtype=torch.long)
    return torch.cat([head, _pick(prompt_len, n - 1, k - head.numel(), gen, allowed)]).sort().values


def _pick(lo: int, hi: int, k: int, gen: torch.Generator, allowed: torch.Tensor | None) -> torch.Tensor:
    """Up to k distinct positions of lo .. hi - 1 (where ``allowed``), unsorted."""
    if hi <= lo:
        return torch.zeros(0, dtype=torch.long)
    cand = torch.arange(lo, hi)
    if allowed is not None:
        cand = cand[allowed[lo:hi]]
    return cand[torch.randperm(cand.numel(), generator=gen)[:k]]


def fresh_positions(ids: torch.Tensor, window: int) -> torch.Tensor:
    """[n] bool: position i starts a ``window``-token stretch that does not repeat an earlier stretch
    of the same sequence. Self-distilled answers of a small target loop (SmolLM2-135M: 57% of the
    15-token windows of its answers repeat earlier text, ``benchmarks/store_repetition.py``); a block
    anchored in a loop teaches copying, not the target's fresh text."""
    seq = ids.tolist()
    seen: set[tuple[int, ...]] = set()
    out = torch.ones(len(seq), dtype=torch.bool)
    for i in range(len(seq) - window + 1):
        w = tuple(seq[i: i + window])
        out[i] = w not in seen
        seen.add(w)
    return out


def build_batch(ids: list[torch.Tensor], anchors: list[torch.Tensor], taps: list[torch.Tensor],
                block_size: int, blocks: int, mask_id: int, known: int = 0,
                paths: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> BlockBatch:
    """ids: per sequence [n]; anchors: per sequence [<= blocks]; taps: per sequence [n-1, T*H];
    ``known``: j known tokens after each anchor token (pre-draft blocks, see the module docstring).
    ``paths``: per sequence (label [n], on_path [n]) of train.prompt_labels.greedy_labels: the label at
    q is label[q], valid only while every position between the anchor and q is on the target's greedy
    path (None: the labels are the ids, all on the path: self-distilled answers)."""
    s, length = len(ids), max(t.shape[0] for t in taps)
    nb = block_size + known  # tokens per block
    feat = torch.zeros(s, length, taps[0].shape[-1], dtype=torch.float32)
    anchor = torch.zeros(s, blocks, dtype=torch.long)
    a_valid = torch.zeros(s, blocks, dtype=torch.bool)
    labels = torch.full((s, blocks, block_size - 1), IGNORE, dtype=torch.long)
    block_ids = torch.full((s, blocks, nb), mask_id, dtype=torch.long)
    offs = torch.arange(nb)
    for i, (seq, anc, tp) in enumerate(zip(ids, anchors, taps, strict=True)):
        feat[i, : tp.shape[0]] = tp.float()
        m = anc.shape[0]
        anchor[i, :m], a_valid[i, :m] = anc, True
        last = seq.shape[0] - 1
        block_ids[i, :m, : known + 1] = seq[(anc[:, None] + offs[None, : known + 1]).clamp_max(last)]
        tgt = anc[:, None] + offs[None, known + 1:]  # [m, B-1]
        ok = tgt <= last
        lab = seq
        if paths is not None:
            lab, on = paths[i]
            span = (anc[:, None] + offs[None, 1:]).clamp_max(last)  # [m, B-1+j]: positions a+1 ..
            run = torch.cat([torch.ones(m, 1, dtype=torch.long), on[span].long().cumprod(-1)], -1)
            ok &= run[:, known: known + block_size - 1].bool()  # on the path from a+1 up to q-1
        labels[i, :m] = torch.where(ok, lab[tgt.clamp_max(last)], IGNORE)
    block_pos = (anchor[:, :, None] + offs).reshape(s, blocks * nb)
    # anchors <= n - 2 < the n - 1 tap rows: every context position below an anchor holds real features
    return BlockBatch(feat, block_ids.reshape(s, -1), block_pos, labels, anchor * a_valid)


@dataclass(frozen=True)
class LossOut:
    loss: torch.Tensor  # [] weighted mean cross-entropy
    correct: torch.Tensor  # [S, K, B-1] bool top-1 hits (False where ignored)
    valid: torch.Tensor  # [S, K, B-1] bool


class BlockLoss(nn.Module):
    """The drafter plus the target's frozen embedding / LM head; forward(batch) -> LossOut (DDP-able).

    Which LM-head rows the softmax runs over:
      * ``train_vocab`` None: the drafter's draft head (core.draft_head), i.e. every row, or the rows
        of its draft vocabulary if it has one; a label outside that vocabulary cannot be drafted, so it
        is left out of the loss and counts as a miss. With neither, this is the exact cross-entropy.
      * ``train_vocab`` [K] ids (the frequent tokens): per step, those rows plus every label of the
        batch, so no label is ever dropped; rare tokens meet the softmax only where they are labels
        (a sampled softmax with the frequent negatives always present).
    Hits (``LossOut.correct``) are top-1 over the same rows; :meth:`draft_hits` scores with the head
    the drafter will actually draft from.

    ``teacher`` with ``soft_alpha`` > 0: each label mixes in the target's own distribution over those
    rows (share ``soft_alpha``), recomputed from the batch's taps (train.teacher)."""

    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 gamma: float, head_dtype: torch.dtype | None = None,
                 train_vocab: torch.Tensor | None = None, teacher: TopLayersTeacher | None = None,
                 soft_alpha: float = 0.0) -> None:
        super().__init__()
        if soft_alpha and (teacher is None or drafter.cfg.final_logit_softcapping):
            raise ValueError("soft labels need a teacher and a target without logit soft-capping")
        self.teacher, self.soft_alpha = (teacher, soft_alpha) if soft_alpha else (None, 0.0)
        self.drafter = drafter
        self.embed_weight = embed_weight.detach()  # plain attributes: frozen, not saved, not synced
        self.head = DraftHead.build(lm_head_weight, drafter.draft_vocab, head_dtype)
        self.full = DraftHead.build(lm_head_weight, None, head_dtype) if train_vocab is not None else None
        self.train_vocab = None if train_vocab is None else train_vocab.sort().values
        self.weights = loss_weights(drafter.cfg.block_size, gamma)

    def hidden(self, b: BlockBatch) -> torch.Tensor:
        """-> final-normed drafter hidden states [S, K*B, H] (the core layer loop; each block's queries
        see the context below their anchor and their own block, train.block_attention)."""
        d = self.drafter
        pos = torch.arange(b.taps.shape[1], device=b.taps.device).expand(b.taps.shape[:2])
        ctx_k, ctx_v = d.context_kv(b.taps, pos)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return block_attention(q, ctx_k[i], ctx_v[i], k, v, b.ctx_len, d.layers[i].self_attn.scale)

        return d.run_layers(F.embedding(b.block_ids, self.embed_weight), b.block_pos, attend)

    def _softmax_rows(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """labels [N] token ids -> (head weight rows [V'', H], each label's row [N], -1 outside)."""
        if self.train_vocab is None:
            return self.head.weight, self.head.label_index()[labels]
        ids = torch.cat([self.train_vocab.to(labels.device), labels]).unique()  # sorted
        return self.full.weight[ids], torch.searchsorted(ids, labels)

    def forward(self, b: BlockBatch) -> LossOut:
        s, k, nb1 = b.labels.shape
        h = b.drafted(self.hidden(b))  # [S, K, B-1, H]
        valid = b.labels != IGNORE
        weight, tgt = self._softmax_rows(b.labels[valid])  # tgt [N]: rows, -1 = cannot be drafted
        inside = tgt >= 0
        w = self.weights.to(h.device).expand(s, k, nb1)[valid][inside]
        rows = h[valid][inside]  # [n, H]: only labels with a row reach the head
        hit = torch.zeros_like(tgt, dtype=torch.bool)
        cfg = self.drafter.cfg
        if cfg.final_logit_softcapping:  # tanh-capped logits: the plain autograd path
            logits = self.drafter.logits(rows.to(weight.dtype), weight).float()  # [n, V'']
            total = (w * F.cross_entropy(logits, tgt[inside], reduction="none")).sum()
            hit[inside] = logits.detach().argmax(-1) == tgt[inside]
        else:
            soft = None
            if self.teacher is not None:  # the target's hidden state where it predicted each label
                t_h = self.teacher(b.taps)  # [S, L, H]
                t_pos = (b.drafted(b.block_pos) - 1).clamp_max(t_h.shape[1] - 1)  # [S, K, B-1]
                soft = t_h[torch.arange(s, device=t_h.device)[:, None, None], t_pos][valid][inside]
            total, hit[inside] = fused_weighted_ce(rows, weight, tgt[inside], w, cfg.output_multiplier,
                                                   teacher=soft, alpha=self.soft_alpha)
        correct = torch.zeros_like(valid)
        correct[valid] = hit
        return LossOut(total / w.sum().clamp_min(1e-9), correct, valid)

    @torch.no_grad()
    def draft_hits(self, b: BlockBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-1 hits [S, K, B-1] of the drafter's own draft head (what it proposes when serving), and
        the valid mask."""
        h = b.drafted(self.hidden(b))
        valid = b.labels != IGNORE
        logits = self.drafter.logits(h[valid].to(self.head.weight.dtype), self.head.weight)
        correct = torch.zeros_like(valid)
        correct[valid] = self.head.to_tokens(logits.argmax(-1)) == b.labels[valid]
        return correct, valid


def expected_accept(correct: torch.Tensor, valid: torch.Tensor) -> float:
    """Mean over full-length blocks of 1 + the number of leading correct drafts (a tau estimate)."""
    full = valid.all(-1)  # [S, K]
    if not bool(full.any()):
        return math.nan
    run = correct.long().cumprod(-1).sum(-1)  # [S, K]
    return float(1 + run[full].float().mean())


def select_draft_vocab(answers: list[torch.Tensor], size: int, vocab_size: int,
                       always: tuple[int, ...] = ()) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent tokens of the answers (ties: lower id), plus ``always`` (e.g. EOS).

    -> (sorted ids [<= size], share of answer tokens they cover)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for a in answers:
        counts += torch.bincount(a.long(), minlength=vocab_size)[:vocab_size]
    score = counts.double()
    score[list(always)] = float("inf")
    order = torch.argsort(-score, stable=True)[:size]
    ids = order.sort().values
    return ids, float(counts[ids].sum()) / max(1, int(counts.sum()))
