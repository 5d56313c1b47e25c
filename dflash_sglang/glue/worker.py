"""Our DFLASH speculative worker for SGLang's V2 (overlap-capable) scheduler path.

Per decode step, for a batch whose committed KV covers [0, p) and whose newest token b (the
bonus) has no KV yet:
  block    [b, mask x (B-1)] at positions p..p+B-1, in the KV slots the scheduler reserved
  draft    one drafter pass over the block (draft runner, TARGET_VERIFY mode, non-causal)
  verify   one target pass over [b, drafts] capturing the tap layers; the logits are scored as no-spec
           would score each position (penalties, structured-output grammar masks, logit_bias)
  accept   core.verify: accepted prefix + bonus per request (greedy or exact rejection sampling)
  commit   publish new lengths p + accept + 1; project committed rows' tap states into the draft
           KV at their slots, so draft KV and target KV cover the same tokens, at the same slots.
Prefill runs the target with tap capture and injects every extend token's features.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.draft_worker_common import build_draft_tp_worker, make_draft_input_v2

from ..core.adaptive import BlockPolicy
from ..core.config import DFlashConfigError, TargetSpec
from ..core.draft_head import load_draft_vocab
from ..core.grammar import BlockGrammar, BlockMasks
from ..core.host_reads import count_host_reads
from ..core.lookup import LookupConfig, overlay_lookup
from ..core.sampling import probs_from_logits, sample_from_probs
from ..core.streams import StreamPlan
from ..core.verify import verify
from ..settings import settings
from .batch_math import Block, committed_rows, extend_positions, make_block, sampling_from_sglang
from .draft_vocab import DraftVocab
from .history import CommittedHistory
from .kernel_choice import choose_kernels
from .logit_adjust import adjust_block_logits, needs_adjustment, needs_history
from .sglang_drafter import DFlashDraftModel

logger = logging.getLogger(__name__)
ADAPTIVE_LOG = "dflash-sglang: adaptive block"  # + "<block> for batch bucket <bucket>", per switch
HOST_READS_LOG = "dflash-sglang: host reads in decode step:"  # + total, by kind (settings.host_read_audit)


class DFlashWorker(BaseSpecWorker):
    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__()
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.server_args = server_args
        self.device = self.model_runner.device
        bundle = build_draft_tp_worker(
            server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port,
            target_model_config=self.model_runner.model_config, algo_label="DFLASH",
            attention_backend_override=_draft_attention_backend(server_args),
        )
        self._draft_worker = bundle.draft_worker
        self.draft_runner = bundle.draft_model_runner
        self.draft_model: DFlashDraftModel = bundle.draft_model
        self.block_size = _resolved_block_size(self.draft_model)
        self.speculative_num_draft_tokens = self.block_size
        self.speculative_num_steps = 1
        self.vocab_size = int(self.model_runner.model_config.vocab_size)
        # the target's embedding and LM head (this rank's vocabulary slice under tensor parallelism)
        self.vocab = DraftVocab(self.model_runner.model,
                                load_draft_vocab(server_args.speculative_draft_model_path), self.vocab_size)
        self.mask_id = _check_pair(self.draft_model, self.model_runner.model_config, self.block_size)
        self.sampling_mode = settings().sampling  # "rejection" | "target_only"
        self.audit_host_reads = settings().host_read_audit == "on"
        self.grammar_draft = settings().grammar_draft == "on"  # structured output drafts under its grammar
        self.generator = torch.Generator(device=self.device).manual_seed(int(server_args.random_seed or 0))
        self.streams = StreamPlan.for_device(self.device)
        # Triton on CUDA with an unsharded draft KV cache, torch otherwise: chosen once
        self.kernels = choose_kernels(self.device, head_sharded=self.draft_model.shard.tp > 1)
        self.policy = _block_policy(self.block_size, self.device, self.vocab.tp)
        self.history = CommittedHistory()  # committed output one step ahead of req.output_ids (overlap)
        self.lookup = _lookup_config(self.device)  # context lookup drafts: every request's text is tracked
        self.stats = {"injected": 0, "draft_forwards": 0, "switches_logged": 0}
        logger.info("dflash-sglang: our DFlash worker runs (block %d, taps %s, sampling %s, streams %s, "
                    "adaptive block %s, kernels %s, draft vocabulary %d, lookup %s)", self.block_size,
                    list(self.draft_model.cfg.target_layer_ids), self.sampling_mode, self.streams.kind,
                    "on" if self.policy else "off", self.kernels.name, self.vocab.size,
                    "on" if self.lookup else "off")

    # ------------------------------------------------------------------ SGLang API
    def weight_update_runners(self) -> list[tuple[str, Any]]:
        return [("draft", self.draft_runner)]

    @property
    def spec_v2_attn_backends(self) -> tuple:
        return (self.model_runner.attn_backend, self.draft_runner.attn_backend)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.__dict__["_target_worker"], name)

    def forward_batch_generation(self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
                                 pp_proxy_tensors: Any = None) -> GenerationBatchResult:
        publish = on_publish or (lambda _lens: None)
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, publish, pp_proxy_tensors)
        if batch.forward_mode.is_idle():
            return self._idle(publish)
        if not self.audit_host_reads:
            return self._decode(batch, publish, grammar_barrier)
        with count_host_reads() as reads:
            out = self._decode(batch, publish, grammar_barrier)
        mode = "greedy" if batch.sampling_info.is_all_greedy else "sampled"
        logger.info("%s %d %s (batch %d, %s) at %s", HOST_READS_LOG, reads.total(),
                    dict(sorted(reads.items())), len(batch.reqs), mode, dict(sorted(reads.sites.items())))
        return out

    # --------------------------------------------------------------------- phases
    def _prefill(self, batch: Any, publish: Any, pp_proxy_tensors: Any) -> GenerationBatchResult:
        out = self._target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, capture_hidden_mode=CaptureHiddenMode.FULL)
        publish(batch.seq_lens)
        out.new_seq_lens = batch.seq_lens
        slots = batch.out_cache_loc.long()
        taps = out.logits_output.hidden_states
        if taps is None:
            raise RuntimeError("dflash-sglang: the target returned no tap-layer hidden states at prefill")
        positions = extend_positions(list(batch.prefix_lens), list(batch.extend_lens), self.device)
        self._inject(taps[: slots.numel()], positions, slots)
        logger.info("dflash-sglang: prefill injected %d context positions (%d reused from cache)",
                    slots.numel(), sum(batch.prefix_lens))
        out.logits_output.hidden_states = None
        self._remember(batch, first=out.next_token_ids)
        out.next_draft_input = make_draft_input_v2(bonus_tokens=out.next_token_ids,
                                                   new_seq_lens=batch.seq_lens)
        return out

    def _idle(self, publish: Any) -> GenerationBatchResult:
        empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        nxt = make_draft_input_v2(bonus_tokens=empty, new_seq_lens=empty)
        publish(nxt.new_seq_lens)
        return GenerationBatchResult(
            logits_output=None, next_token_ids=empty, accept_lens=empty.int(), next_draft_input=nxt,
            can_run_cuda_graph=False, speculative_num_draft_tokens=self.block_size,
            new_seq_lens=nxt.new_seq_lens)

    def _decode(self, batch: Any, publish: Any, grammar_barrier: Any = None) -> GenerationBatchResult:
        bs = len(batch.seq_lens)
        nb = self.policy.choose(bs) if self.policy else self.block_size
        started = time.perf_counter()
        prefix = batch.seq_lens.long()
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        block = make_block(batch.spec_info.bonus_tokens, prefix, batch.req_pool_indices, req_to_token,
                           self.mask_id, nb)
        sampling = sampling_from_sglang(batch.sampling_info, bs, self.device)
        host_lens = _host_seq_lens(batch)
        grammar = self._block_grammar(batch, nb, grammar_barrier)
        with self.streams.draft():
            draft_probs, masks = self._draft(batch, block, sampling, host_lens, grammar)
        self.streams.join()
        logits, taps, logits_output = self._verify_target(batch, block, host_lens)
        logits = self._as_nospec_scores(batch, block, logits, grammar, masks)
        if batch.sampling_info.is_all_greedy:  # host flag SGLang keeps: no device sync to decide
            res = self.kernels.greedy_accept(block.tokens, logits.view(bs, nb, -1).argmax(-1))
        else:
            res = verify(block.tokens, logits.view(bs, nb, -1), sampling, draft_probs, self.generator)
        if self.policy:
            self._record_policy(bs, nb, res.accept_len, _elapsed(started, self.device))
        new_lens = prefix + res.num_committed
        publish(new_lens)
        self._remember(batch, committed=res.committed, counts=res.num_committed)
        keep = committed_rows(res.num_committed, nb)  # [bs, B]
        self._inject(taps.view(bs * nb, -1)[keep.view(-1)], block.positions[keep], block.slots[keep])
        logits_output.hidden_states = None
        next_ids = torch.where(res.committed < 0, torch.zeros_like(res.committed), res.committed)
        if batch.return_logprob:  # the target's (adjusted) log-probabilities of the committed tokens
            logits_output.next_token_logits = logits
            compute_spec_logprobs(batch, logits_output, next_ids.view(-1), chain_stride=nb)
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=next_ids.view(-1),
            accept_lens=res.num_committed.int(), can_run_cuda_graph=False,
            next_draft_input=make_draft_input_v2(bonus_tokens=res.bonus, new_seq_lens=new_lens),
            speculative_num_draft_tokens=nb, new_seq_lens=new_lens)

    def _as_nospec_scores(self, batch: Any, block: Block, logits: torch.Tensor, grammar: BlockGrammar | None,
                          masks: BlockMasks | None) -> torch.Tensor:
        """Raw target logits [bs*B, V] -> the logits no-spec would sample from at each block position:
        penalties, grammar masks (along the drafts), logit_bias, custom processors."""
        if grammar is not None and masks is None:
            masks = grammar.masks_along(block.tokens)
        if masks is None and not needs_adjustment(batch):
            return logits
        bs, nb = block.tokens.shape
        outputs = self.history.outputs(batch.reqs)
        return adjust_block_logits(batch, block.tokens, logits.view(bs, nb, -1), masks, outputs).flatten(0, 1)

    def _remember(self, batch: Any, first: torch.Tensor | None = None, committed: torch.Tensor | None = None,
                  counts: torch.Tensor | None = None) -> None:
        """Extends the committed trail of requests whose scores read their history (every request while
        context lookup drafts are on): after a prefill (first [bs]) or a decode step (committed [bs, B]
        -1 padded, counts [bs])."""
        rows = [i for i, r in enumerate(batch.reqs) if self.lookup is not None or needs_history(r)]
        if not rows:
            return
        if first is not None:
            self.history.start(batch.reqs, rows, first)
        else:
            self.history.extend(batch.reqs, rows, committed, counts)

    def _draft(self, batch: Any, block: Block, sampling: Any, host_lens: torch.Tensor,
               grammar: BlockGrammar | None) -> tuple[torch.Tensor | None, BlockMasks | None]:
        """Fill block.tokens[:, 1:] with drafts; -> their probabilities [bs, B-1, V] (None: argmax)
        and, when drafting ran under the grammar, the block's grammar masks (else None)."""
        nb = block.tokens.shape[1]
        if nb == 1:
            return None, None
        spec = DFlashVerifyInput(draft_token=block.tokens.view(-1), positions=block.positions.view(-1),
                                 draft_token_num=nb, capture_hidden_mode=CaptureHiddenMode.NULL)
        fb = self._verify_forward_batch(batch, spec, block, host_lens, self._draft_worker)
        fb.input_embeds = self.vocab.embed(block.tokens.view(-1))
        hidden = self.draft_runner.forward(fb).logits_output.hidden_states  # [bs*B, H]
        self.stats["draft_forwards"] += 1
        hidden = hidden.view(block.tokens.shape[0], nb, -1)[:, 1:]
        logits = self.vocab.logits(self.draft_model.drafter, hidden)  # [bs, B-1, V'_rank]
        greedy = self.sampling_mode == "target_only" or batch.sampling_info.is_all_greedy
        if grammar is not None and self.grammar_draft:
            whole = self.vocab.whole_logits(logits)  # [bs, B-1, V']
            return self._draft_under_grammar(block, whole, sampling, grammar, greedy)
        if greedy:
            block.tokens[:, 1:] = self.vocab.argmax_tokens(logits)
            self._lookup(batch, block, None)
            return None, None
        head = self.vocab.whole_head
        q = probs_from_logits(self.vocab.whole_logits(logits).float(), sampling)  # [bs, B-1, V']
        block.tokens[:, 1:] = head.to_tokens(sample_from_probs(q, self.generator))
        return self._lookup(batch, block, head.full(q)), None

    def _lookup(self, batch: Any, block: Block, draft_probs: torch.Tensor | None) -> torch.Tensor | None:
        """Context lookup drafts over the drafter's, in place (core.lookup); -> draft_probs [bs, B-1, V]
        with one-hot rows where lookup drafted (None stays None). Every rank computes the same drafts:
        the committed text is the same on all of them."""
        if self.lookup is not None:
            outputs = self.history.outputs(batch.reqs)
            texts = [list(r.origin_input_ids) + out for r, out in zip(batch.reqs, outputs, strict=True)]
            overlay_lookup(block.tokens, draft_probs, texts, self.lookup)
        return draft_probs

    def _draft_under_grammar(self, block: Block, logits: torch.Tensor, sampling: Any, grammar: BlockGrammar,
                             greedy: bool) -> tuple[torch.Tensor | None, BlockMasks]:
        """Drafts chosen position by position, each from logits [bs, B-1, V'] masked by the grammar
        state along the drafts before it; the masks are then the verification masks."""
        qs: list[torch.Tensor] = []  # [bs, V'] per position: the distributions actually sampled

        def choose(j: int, logits_j: torch.Tensor) -> torch.Tensor:
            if greedy:
                rows = logits_j.argmax(-1)
            else:
                qs.append(probs_from_logits(logits_j.float(), sampling))
                rows = sample_from_probs(qs[-1], self.generator)
            block.tokens[:, j + 1] = head.to_tokens(rows)
            return block.tokens[:, j + 1]

        head = self.vocab.whole_head
        masks = grammar.draft_constrained(logits, choose, head.columns)
        return (None if greedy else head.full(torch.stack(qs, 1))), masks

    def _block_grammar(self, batch: Any, nb: int, barrier: Any) -> BlockGrammar | None:
        """The batch's live grammars (structured output), None when no request is constrained."""
        if not getattr(batch, "has_grammar", False):
            return None
        if barrier is not None:  # overlap: the previous batch's committed tokens advance the matchers first
            barrier()
        live = [r.grammar if r.grammar is not None and not r.grammar.finished else None for r in batch.reqs]
        return BlockGrammar.of(live, nb, self.vocab_size)

    def _verify_target(self, batch: Any, block: Block, host_lens: torch.Tensor) -> tuple:
        """-> logits [bs*B, V], tap states [bs*B, T*H], the LogitsProcessorOutput."""
        spec = DFlashVerifyInput(draft_token=block.tokens.view(-1), positions=block.positions.view(-1),
                                 draft_token_num=block.tokens.shape[1],
                                 capture_hidden_mode=CaptureHiddenMode.FULL)
        fb = self._verify_forward_batch(batch, spec, block, host_lens, self._target_worker)
        out = self._target_worker.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)
        lo = out.logits_output
        return lo.next_token_logits.float(), lo.hidden_states, lo

    def _verify_forward_batch(self, batch: Any, spec: DFlashVerifyInput, block: Block,
                              host_lens: torch.Tensor, worker: Any) -> Any:
        """A TARGET_VERIFY ForwardBatch over the block for `worker`'s runner (SGLang's own builder)."""
        batch.out_cache_loc = block.slots.view(-1)
        batch.seq_lens_cpu = host_lens + block.tokens.shape[1]  # host upper bound: prefix + B
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        spec.live_seq_lens_cpu = host_lens
        fb, _ = spec.prepare_for_verify(batch, worker)
        return fb

    def _record_policy(self, bs: int, nb: int, accept_len: torch.Tensor, seconds: float) -> None:
        self.policy.record(bs, nb, accept_len, seconds)
        for step, bucket, block in self.policy.switches[self.stats["switches_logged"]:]:
            self.stats["switches_logged"] += 1
            logger.info("%s %d for batch bucket %d (decode step %d; est. tok/s by block %s)", ADAPTIVE_LOG,
                        block, bucket, step, self.policy.summary().get(str(bucket)))

    def _inject(self, taps: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        self.kernels.inject(self.draft_model, taps, positions, slots, self.draft_runner.token_to_kv_pool)
        self.stats["injected"] += int(slots.numel())


# ----------------------------------------------------------------------------- helpers
def _block_policy(block_size: int, device: Any, tp: int) -> BlockPolicy | None:
    """The adaptive block policy times each rank's own steps, so under tensor parallelism ranks could
    choose different blocks and their collectives would no longer match: it runs at tp 1 only."""
    mode = settings().adaptive
    on = mode == "on" or (mode == "auto" and torch.device(device).type == "cpu")
    if on and tp > 1:
        logger.warning("dflash-sglang: adaptive block off under tensor parallelism (ranks time their "
                       "steps independently); fixed block %d", block_size)
        return None
    return BlockPolicy(block_size) if on and block_size > 1 else None


def _lookup_config(device: Any) -> LookupConfig | None:
    """Context lookup drafts read each request's committed tokens on the host every step: free on the
    CPU, a device sync per step on an accelerator (which would stall the overlap pipeline), so ``auto``
    turns them on for CPU targets only; a device-side lookup is planned."""
    mode = settings().lookup
    on = mode == "on" or (mode == "auto" and torch.device(device).type == "cpu")
    return LookupConfig() if on else None


def _resolved_block_size(draft: Any) -> int:
    """--speculative-num-draft-tokens as SGLang resolved it (it defaults to the drafter's
    block_size), else the drafter's own block_size."""
    from sglang.srt.runtime_context import get_spec

    resolved = get_spec().speculative_num_draft_tokens
    return int(resolved) if resolved is not None else int(draft.cfg.block_size)


def _elapsed(started: float, device: Any) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _host_seq_lens(batch: Any) -> torch.Tensor:
    if batch.seq_lens_cpu is not None:
        return batch.seq_lens_cpu.clone()
    return batch.spec_info.nxt_kv_lens_cpu.clone()


def _draft_attention_backend(server_args: Any) -> str | None:
    """On SGLang's own platforms use its choice; on out-of-tree ones, the target's backend."""
    from sglang.srt.platforms import current_platform

    if current_platform.is_out_of_tree():
        return server_args.attention_backend or current_platform.get_default_attention_backend()
    return None


def _check_pair(draft: Any, target_cfg: Any, block_size: int) -> int:
    if not isinstance(draft, DFlashDraftModel):
        raise DFlashConfigError(
            f"draft model class {type(draft).__name__}: expected a DFlash drafter "
            "(config.json architectures ['DFlashDraftModel'])")
    hf = target_cfg.hf_config
    text = getattr(hf, "text_config", None) or hf
    spec = TargetSpec(int(text.hidden_size), int(target_cfg.vocab_size), int(text.num_hidden_layers))
    draft.cfg.validate_against(spec)
    if block_size > draft.cfg.block_size:
        logger.warning("dflash-sglang: block size %d exceeds the drafter's trained block_size %d",
                       block_size, draft.cfg.block_size)
    return int(draft.cfg.mask_token_id)
