"""Reference DFlash engine over an HF transformers target: batched, exact, readable.

One step for a batch of requests (B = block size):
  draft   block [last committed token, mask x (B-1)] -> drafter -> B-1 draft tokens (+ their probs)
  verify  the target runs the whole block once (positions n-1 .. n+B-2) -> logits and tap states
  accept  core.verify: longest accepted prefix + one bonus token per request (ragged)
  commit  block positions 0..accept_len stay valid in the target KV; the rest are masked out forever;
          their tap states are projected into the drafter's context KV. The bonus token is NOT in
          any cache yet: it is position 0 of the next block (the paper's bonus handling).
Rejected target KV is masked, not cropped (HF caches cannot crop per row); finished requests are
dropped from the batch, which bounds the waste.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .draft_cache import DraftContextCache
from .draft_head import DraftHead
from .drafter import ContextKV, DFlashDrafter
from .lookup import LookupConfig, LookupStats, overlay_lookup
from .predraft import Calibration, DraftBelief, PreDrafts, PreDraftStats, predict_outcomes, predraft_block
from .sampling import SamplingConfig, probs_from_logits, sample_from_probs
from .streams import StreamPlan
from .target import HFTarget, TargetOutput, left_pad
from .verify import VerifyResult, verify

SAMPLING_MODES = ("rejection", "target_only")
PREDRAFT_ALTERNATIVES = 4  # bonus candidates per block position for the pre-draft guesses


@dataclass(frozen=True)
class EngineConfig:
    block_size: int
    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    sampling_mode: str = "rejection"  # "rejection" (draft probs) | "target_only" (argmax drafts)
    # dtype of the LM head when drafting (None: core.draft_head.head_dtype_for decides). Any precision
    # is lossless: greedy verification never trusts a draft, and sampled drafts are verified against
    # the q they came from.
    draft_head_dtype: torch.dtype | None = None
    # F > 0: pre-draft block n+1 for the F likeliest outcomes of verify(n) (issue #20; PreDrafter)
    predraft_fanout: int = 0
    # CPU: run that pre-draft on a second thread while the target verifies (on CUDA it always runs on
    # the drafter's side stream, event-ordered: PreDrafter)
    predraft_thread: bool = False
    # context lookup drafts (core.lookup): rows whose newest n-gram occurred before in their own text
    # draft its continuation instead of the drafter's guess; None: the drafter alone
    lookup: LookupConfig | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size}: must be >= 1")
        if self.predraft_fanout < 0:
            raise ValueError(f"predraft_fanout={self.predraft_fanout}: must be >= 0 (0: off)")
        if self.sampling_mode not in SAMPLING_MODES:
            raise ValueError(f"sampling_mode={self.sampling_mode!r}: use one of {SAMPLING_MODES}")


@dataclass(frozen=True)
class StepRecord:
    """What one draft + verify step saw, for observers (measurements such as pre-draft hit rates)."""

    req: torch.Tensor  # [bs] request index of each row
    block: torch.Tensor  # [bs, B] block tokens: last committed token, then the drafts
    draft_logits: torch.Tensor | None  # [bs, B-1, V] drafter logits over the full vocabulary
    result: VerifyResult


StepObserver = Callable[[StepRecord], None]


@dataclass
class RequestResult:
    output_ids: list[int]
    steps: int = 0  # verify steps this request took part in
    committed_per_step: list[int] = field(default_factory=list)  # accept_len + 1 per step


@dataclass
class _Batch:
    """Live requests. Rows are compacted when requests finish; `req` maps row -> request index."""

    req: torch.Tensor  # [bs] request index
    last: torch.Tensor  # [bs] newest committed token (not yet in any cache)
    n: torch.Tensor  # [bs] committed length, prompt + output, including `last`
    kv_valid: torch.Tensor  # [bs, T] target KV slots that hold committed tokens
    cache: object  # HF DynamicCache, T slots per row
    draft: DraftContextCache | None  # None for plain decoding
    sampling: SamplingConfig
    reuse: PreDrafts | None = None  # pre-drafts made while the last block was verified
    reuse_hit: torch.Tensor | None = None  # [bs] which of them matched verify's outcome, -1: none


class ReferenceEngine:
    def __init__(self, target: HFTarget, drafter: DFlashDrafter, cfg: EngineConfig,
                 observer: StepObserver | None = None, calibration: Calibration | None = None) -> None:
        drafter.cfg.validate_against(target.spec)
        self.observer = observer  # called after every verify with a StepRecord
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.mask_id = int(drafter.cfg.mask_token_id)  # validated above
        self.injected = 0  # context positions projected into draft KV, over all generate() calls
        # [V', H]: the target's LM head, restricted to the drafter's draft vocabulary if it has one
        self.head = DraftHead.build(target.lm_head_weight, drafter.draft_vocab, cfg.draft_head_dtype)
        fanout = cfg.predraft_fanout if cfg.block_size > 1 else 0
        self.predrafter = PreDrafter(self, fanout, calibration or Calibration.identity()) if fanout else None
        self.lookup_stats = LookupStats()

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> list[RequestResult]:
        results = [RequestResult([]) for _ in prompts]
        batch, out, pos, valid = _prefill(self.target, prompts, sampling, generator, results)
        cap = pos.shape[1] + self.cfg.max_new_tokens + self.cfg.block_size + 1
        batch.draft = DraftContextCache(self.drafter, len(prompts), cap, out.taps.device, out.taps.dtype)
        batch.draft.inject(out.taps, pos, valid)
        batch = _retire(batch, results, self.cfg)
        while batch is not None:
            block, draft_probs, logits = self._draft(batch, generator)
            placed = self._lookup(batch, block, draft_probs, prompts, results)
            positions = _block_positions(batch, self.cfg.block_size)
            pending = None if self.predrafter is None else self.predrafter.start(batch, block, draft_probs,
                                                                                 logits, generator)
            out = self.target.forward(block, positions, _visible(batch, self.cfg.block_size), batch.cache)
            res = verify(block, out.logits, batch.sampling, draft_probs, generator)
            if self.observer is not None:
                full = None if logits is None else self.head.full_logits(logits)
                self.observer(StepRecord(batch.req, block, full, res))
            if pending is not None:  # joined before commit: the pre-draft reads the draft context
                self.predrafter.finish(batch, pending.result(), res)
            if placed is not None:
                self.lookup_stats.record(placed, res.num_committed)
            self._commit(batch, block, out.taps, res, results)
            batch = _retire(batch, results, self.cfg)
        return results

    def _lookup(self, b: _Batch, block: torch.Tensor, draft_probs: torch.Tensor | None,
                prompts: list[list[int]], results: list[RequestResult]) -> list[int] | None:
        """Context lookup drafts over the drafter's (core.lookup), in place; -> [bs] lookup tokens per
        row, None when lookup is off or the block holds no drafts."""
        if self.cfg.lookup is None or block.shape[1] < 2:
            return None
        history = [prompts[r] + results[r].output_ids for r in b.req.tolist()]  # ends with b.last
        return overlay_lookup(block, draft_probs, history, self.cfg.lookup)

    def _draft(
        self, b: _Batch, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """-> block tokens [bs, B], the draft probabilities [bs, B-1, V] (None: argmax drafts) and the
        drafter's logits over the draft head's rows [bs, B-1, V'] (None at B = 1).

        Drafts come from the draft head's rows (V' <= V); q is zero outside them. A row whose previous
        verify outcome was pre-drafted (core.predraft) takes that pre-draft; the others are drafted now."""
        bsz, nb = b.last.shape[0], self.cfg.block_size
        block = torch.full((bsz, nb), self.mask_id, dtype=torch.long, device=b.last.device)
        block[:, 0] = b.last
        if nb == 1:
            return block, None, None
        hit = b.reuse_hit if b.reuse is not None else torch.full_like(b.last, -1)
        fresh, used = (hit < 0).nonzero().flatten(), (hit >= 0).nonzero().flatten()
        rows_q = None if self.cfg.sampling_mode == "target_only" else \
            torch.empty(bsz, nb - 1, self.head.size, device=block.device)
        logits = torch.empty(bsz, nb - 1, self.head.size, device=block.device)
        if fresh.numel():
            tokens, q, lg = self._draft_rows(b, fresh if used.numel() else None, generator)
            block[fresh, 1:], logits[fresh] = tokens, lg
            if rows_q is not None:
                rows_q[fresh] = q
        if used.numel():
            assert b.reuse is not None
            g = hit[used]
            block[used, 1:], logits[used] = b.reuse.tokens[used, g], b.reuse.logits[used, g]
            if rows_q is not None:
                assert b.reuse.rows_q is not None
                rows_q[used] = b.reuse.rows_q[used, g]
        return block, None if rows_q is None else self.head.full(rows_q), logits

    def _draft_rows(self, b: _Batch, rows: torch.Tensor | None, generator: torch.Generator | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Draft block [last, mask x (B-1)] of ``rows`` (None: every row) -> draft tokens [n, B-1], their
        probabilities over the head's rows [n, B-1, V'] (None: argmax drafts), logits [n, B-1, V']."""
        assert b.draft is not None
        nb = self.cfg.block_size
        ctx, pos, last, sampling = b.draft.view(), _block_positions(b, nb), b.last, b.sampling
        if rows is not None:
            ctx, pos, last, sampling = ctx_rows(ctx, rows), pos[rows], last[rows], sampling.select(rows)
        block = torch.full((last.shape[0], nb), self.mask_id, dtype=torch.long, device=last.device)
        block[:, 0] = last
        hidden = self.drafter.forward_block(self.target.embed(block), pos, ctx)
        return self.sample_drafts(hidden[:, 1:], sampling, generator)

    def sample_drafts(self, hidden: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Drafter hidden states [n, m, H] -> (tokens [n, m], q over the head's rows [n, m, V'] or None
        for argmax drafts, logits [n, m, V']): the one place drafts are picked from the drafter."""
        logits = self.drafter.logits(hidden.to(self.head.weight.dtype), self.head.weight).float()
        if self.cfg.sampling_mode == "target_only":
            return self.head.to_tokens(logits.argmax(-1)), None, logits
        q = probs_from_logits(logits, sampling)
        return self.head.to_tokens(sample_from_probs(q, generator)), q, logits

    def _commit(self, b: _Batch, block: torch.Tensor, taps: torch.Tensor, res: VerifyResult,
                results: list[RequestResult]) -> None:
        nb = self.cfg.block_size
        keep = torch.arange(nb, device=block.device)[None] <= res.accept_len[:, None]  # [bs, B]
        b.kv_valid = torch.cat([b.kv_valid, keep], dim=1)
        assert b.draft is not None
        before = b.draft.injected
        b.draft.inject(taps, _block_positions(b, nb), keep)
        self.injected += b.draft.injected - before
        for row, (r, k) in enumerate(zip(b.req.tolist(), res.num_committed.tolist(), strict=True)):
            out = results[r]
            out.output_ids.extend(res.committed[row, :k].tolist())
            out.steps += 1
            out.committed_per_step.append(k)
        b.last = res.bonus
        b.n = b.n + res.num_committed


class PreDrafter:
    """Issue #20 in the reference engine: while the target verifies block n, draft block n+1 for the F
    likeliest outcomes of that verify (core.predraft), in one batched drafter pass; on a hit the next
    step uses that pre-draft instead of drafting. Verification is unchanged, so output is lossless
    either way (a sampled pre-draft is drawn from, and verified against, its own q).

    Where the pre-draft runs is chosen once here (``where``): "cuda-stream" on a CUDA target (the
    drafter's side stream, ordered after block n's drafts by an event, concurrent with verify(n)),
    "thread" on CPU with ``predraft_thread``, else "inline" (before verify, sequentially)."""

    def __init__(self, engine: ReferenceEngine, fanout: int, calibration: Calibration) -> None:
        self.engine, self.fanout, self.calibration = engine, fanout, calibration
        self.stats = PreDraftStats(fanout)
        self.streams = StreamPlan.for_device(engine.target.device)
        self.where = "cuda-stream" if self.streams.stream is not None else \
            "thread" if engine.cfg.predraft_thread else "inline"
        self._pool = ThreadPoolExecutor(1) if self.where == "thread" else None

    def start(self, b: _Batch, block: torch.Tensor, draft_probs: torch.Tensor | None, logits: torch.Tensor,
              generator: torch.Generator | None) -> Future[PreDrafts] | _OnSideStream:
        """Begin the pre-draft of block n+1; call it once block n's drafts are enqueued and before the
        target's verify(n) is. A threaded sampled pre-draft draws from its own generator: a
        torch.Generator is not shared across threads."""
        if self.where == "cuda-stream":
            with self.streams.side(self.streams.mark()):
                pre = self.run(b, block, draft_probs, logits, generator)
            return _OnSideStream(self.streams, pre)
        if self._pool is None:
            done: Future[PreDrafts] = Future()
            done.set_result(self.run(b, block, draft_probs, logits, generator))
            return done
        own = None if generator is None else torch.Generator(block.device).manual_seed(
            int(torch.randint(2**62, (1,), generator=generator)))
        return self._pool.submit(self.run, b, block, draft_probs, logits, own)

    def run(self, b: _Batch, block: torch.Tensor, draft_probs: torch.Tensor | None, logits: torch.Tensor,
            generator: torch.Generator | None) -> PreDrafts:
        e, nb = self.engine, self.engine.cfg.block_size
        with torch.no_grad():
            belief_p = torch.softmax(e.head.full_logits(logits), -1)  # [bs, B-1, V]: the drafter's belief
            if draft_probs is not None:  # sampled rows drafted from q: their confidence is q's
                belief_p = torch.where(b.sampling.is_greedy[:, None, None], belief_p, draft_probs)
            guess = predict_outcomes(DraftBelief.from_probs(belief_p, block[:, 1:], PREDRAFT_ALTERNATIVES),
                                     self.calibration, self.fanout)
            f = guess.accept_len.shape[1]
            inp = predraft_block(block, b.n - 1, guess, e.mask_id)
            assert b.draft is not None
            rep = torch.arange(block.shape[0], device=block.device).repeat_interleave(f)  # [bs*F]
            hidden = e.drafter.forward_block(e.target.embed(inp.tokens), inp.positions,
                                             ctx_rows(b.draft.view(), rep), inp.valid)
            hidden = hidden.gather(1, inp.draft_at[..., None].expand(-1, -1, hidden.shape[-1]))
            tokens, q, lg = e.sample_drafts(hidden, b.sampling.select(rep), generator)
        bs = block.shape[0]
        return PreDrafts(guess, tokens.view(bs, f, nb - 1), lg.view(bs, f, nb - 1, -1),
                         None if q is None else q.view(bs, f, nb - 1, -1))

    def finish(self, b: _Batch, pre: PreDrafts, res: VerifyResult) -> None:
        """Score the guesses against verify's real outcome; hits become next step's drafts."""
        hit = pre.match(res.accept_len, res.bonus)  # [bs]
        st = self.stats
        st.steps += int(hit.shape[0])
        for rank in hit[hit >= 0].tolist():
            st.hit_rank[rank] += 1
        was_pre = b.reuse_hit >= 0 if b.reuse is not None and b.reuse_hit is not None \
            else torch.zeros_like(hit, dtype=torch.bool)
        st.predrafted_steps += int(was_pre.sum())
        st.predrafted_committed += int(res.num_committed[was_pre].sum())
        st.normal_committed += int(res.num_committed[~was_pre].sum())
        b.reuse, b.reuse_hit = pre, hit


@dataclass
class _OnSideStream:
    """A pre-draft enqueued on the side stream; ``result()`` orders the main stream after it."""

    streams: StreamPlan
    pre: PreDrafts

    def result(self) -> PreDrafts:
        p = self.pre
        self.streams.join([t for t in (p.tokens, p.logits, p.rows_q, p.guess.accept_len, p.guess.bonus,
                                       p.guess.prob) if t is not None])
        return p


def ctx_rows(ctx: ContextKV, rows: torch.Tensor) -> ContextKV:
    """The context KV of request ``rows`` [n] (indices; repeats allowed)."""
    return ContextKV([k[rows] for k in ctx.keys], [v[rows] for v in ctx.values], ctx.positions[rows],
                     ctx.valid[rows])


# ---------------------------------------------------------------------------- shared phases
def _prefill(
    target: HFTarget, prompts: list[list[int]], sampling: SamplingConfig,
    generator: torch.Generator | None, results: list[RequestResult],
) -> tuple[_Batch, TargetOutput, torch.Tensor, torch.Tensor]:
    """Left-padded prompt pass; samples each request's first token. -> batch, output, pos, valid."""
    from transformers import DynamicCache

    dev = target.device
    bs = len(prompts)
    ids, valid, pos = left_pad(prompts, dev)  # [bs, P] each
    cache = DynamicCache()
    out = target.forward(ids, pos, valid.long(), cache)
    first = sample_from_probs(probs_from_logits(out.logits[:, -1], sampling), generator)  # [bs]
    for i, t in enumerate(first.tolist()):
        results[i].output_ids.append(t)
    n = torch.tensor([len(p) + 1 for p in prompts], device=dev)
    return _Batch(torch.arange(bs, device=dev), first, n, valid, cache, None, sampling), out, pos, valid


def _block_positions(b: _Batch, nb: int) -> torch.Tensor:
    return (b.n - 1)[:, None] + torch.arange(nb, device=b.n.device)  # [bs, B]


def _visible(b: _Batch, nb: int) -> torch.Tensor:
    """HF 2D attention mask for a step of nb new tokens: [bs, T + nb]."""
    ones = torch.ones(b.kv_valid.shape[0], nb, dtype=torch.long, device=b.n.device)
    return torch.cat([b.kv_valid.long(), ones], dim=1)


def _retire(b: _Batch, results: list[RequestResult], cfg: EngineConfig) -> _Batch | None:
    """Truncate finished requests at EOS / max_new_tokens and drop them from the batch."""
    alive = []
    for row, r in enumerate(b.req.tolist()):
        out = results[r].output_ids
        stop = next((i for i, t in enumerate(out) if t in cfg.eos_token_ids), None)
        if stop is not None or len(out) >= cfg.max_new_tokens:
            del out[min(cfg.max_new_tokens, len(out) if stop is None else stop + 1):]
        else:
            alive.append(row)
    if not alive:
        return None
    if len(alive) < b.req.shape[0]:
        rows = torch.tensor(alive, device=b.req.device)
        b.cache.batch_select_indices(rows)
        if b.draft is not None:
            b.draft.select(rows)
        if b.reuse is not None and b.reuse_hit is not None:
            b.reuse, b.reuse_hit = b.reuse.select(rows), b.reuse_hit[rows]
        b.req, b.last, b.n, b.kv_valid = b.req[rows], b.last[rows], b.n[rows], b.kv_valid[rows]
        b.sampling = b.sampling.select(rows)
    return b


@torch.no_grad()
def autoregressive_generate(
    target: HFTarget, prompts: list[list[int]], max_new_tokens: int, eos_token_ids: tuple[int, ...],
    sampling: SamplingConfig, generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Plain decoding of a (left-padded) batch with the target alone: the baseline."""
    cfg = EngineConfig(block_size=1, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
    results = [RequestResult([]) for _ in prompts]
    batch = _retire(_prefill(target, prompts, sampling, generator, results)[0], results, cfg)
    while batch is not None:
        block = batch.last[:, None]
        out = target.forward(block, _block_positions(batch, 1), _visible(batch, 1), batch.cache)
        res = verify(block, out.logits, batch.sampling, None, generator)
        batch.kv_valid = torch.cat([batch.kv_valid, torch.ones_like(batch.kv_valid[:, :1])], dim=1)
        for row, r in enumerate(batch.req.tolist()):
            results[r].output_ids.append(int(res.bonus[row]))
        batch.last, batch.n = res.bonus, batch.n + 1
        batch = _retire(batch, results, cfg)
    return [r.output_ids for r in results]
