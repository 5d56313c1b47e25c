"""Verification of a DFlash draft block against the target model (pure PyTorch, batched).

Block convention (B = block size, B >= 1):
  * ``block_tokens[:, 0]`` is the last committed token, ``block_tokens[:, 1:]`` the B-1 draft tokens.
  * ``target_*[:, i]`` is the target's prediction for the token at block position i+1, so draft token
    j (block position j, 1 <= j <= B-1) is checked against target row j-1.
  * ``draft_probs[:, j-1]`` is the distribution the draft token at block position j was sampled from.
  * The result commits ``drafts[:accept_len] + [bonus]`` (accept_len + 1 tokens), where the bonus is
    drawn from target row ``accept_len`` (residual distribution after a rejection).

Invariant: for sampled rows every committed token is distributed exactly as the target distribution p
(standard speculative rejection sampling); for greedy rows the output equals target argmax decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_sglang.core.sampling import SamplingConfig, probs_from_logits, sample_from_probs

PAD_TOKEN = -1


@dataclass(frozen=True)
class VerifyResult:
    accept_len: torch.Tensor  # [bs] int64 in [0, B-1], number of accepted draft tokens
    bonus: torch.Tensor  # [bs] int64, token drawn from target row accept_len
    committed: torch.Tensor  # [bs, B] int64, drafts[:accept_len] + [bonus], right-padded with -1
    num_committed: torch.Tensor  # [bs] int64, accept_len + 1


def _check_shapes(block_tokens: torch.Tensor, target: torch.Tensor) -> None:
    if block_tokens.dim() != 2 or block_tokens.shape[1] < 1:
        raise ValueError(f"block_tokens must be [bs, B] with B >= 1, got {tuple(block_tokens.shape)}")
    if target.dim() != 3 or target.shape[:2] != block_tokens.shape:
        raise ValueError(f"target must be [bs, B, V] matching block {tuple(block_tokens.shape)}")


def leading_true_count(ok: torch.Tensor) -> torch.Tensor:
    """ok: [bs, n] bool -> [bs] int64 length of the all-True prefix (0 when n == 0)."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def _row_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x: [bs, n, V], index: [bs] in [0, n) -> x[b, index[b]] as [bs, V]."""
    idx = index.view(-1, 1, 1).expand(-1, 1, x.shape[-1])
    return x.gather(1, idx).squeeze(1)


def result_from_accept(block_tokens: torch.Tensor, accept_len: torch.Tensor,
                       bonus: torch.Tensor) -> VerifyResult:
    """committed[b] = drafts[:accept_len] + [bonus], padded with -1 to B columns (int64 everywhere)."""
    bs, block = block_tokens.shape
    pad = torch.full((bs, 1), PAD_TOKEN, dtype=torch.int64, device=block_tokens.device)
    drafts = torch.cat([block_tokens[:, 1:].long(), pad], dim=1)  # [bs, B], slot k = block position k+1
    pos = torch.arange(block, device=block_tokens.device).view(1, -1)  # [1, B]
    al = accept_len.view(-1, 1)  # [bs, 1]
    committed = torch.where(pos < al, drafts, torch.where(pos == al, bonus.view(-1, 1), pad))
    return VerifyResult(accept_len=accept_len, bonus=bonus, committed=committed, num_committed=accept_len + 1)


def greedy_verify(block_tokens: torch.Tensor, target_logits: torch.Tensor) -> VerifyResult:
    """Accept the longest prefix of drafts equal to the target argmax; bonus = argmax of row accept_len."""
    _check_shapes(block_tokens, target_logits)
    target_ids = target_logits.argmax(dim=-1)  # [bs, B]
    accept_len = leading_true_count(block_tokens[:, 1:] == target_ids[:, :-1])  # [bs]
    bonus = target_ids.gather(1, accept_len.view(-1, 1)).squeeze(1)  # [bs]
    return result_from_accept(block_tokens, accept_len, bonus)


def _accept_prefix(
    p_draft: torch.Tensor, q_draft: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Sequential accept test, accept d_j iff u_j < p(d_j) / q(d_j), written as u_j * q < p.

    p_draft, q_draft: [bs, B-1] probabilities of each draft token. The product form never divides:
    q = 0 with p > 0 always accepts, p = 0 always rejects (u * q >= 0). Returns accept_len [bs].
    """
    u = torch.rand(p_draft.shape, generator=generator, device=p_draft.device)  # [bs, B-1] in [0, 1)
    return leading_true_count(u * q_draft < p_draft)


def _sample_residual(
    residual: torch.Tensor, p_row: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Draw from normalize(residual), or from p_row where the residual has no mass. [bs, V] -> [bs]."""
    has_mass = residual.sum(dim=-1, keepdim=True) > 0  # [bs, 1]
    # multinomial normalises each row itself, so no explicit division is needed.
    return sample_from_probs(torch.where(has_mass, residual, p_row), generator)


def _draft_token_probs(probs: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """probs: [bs, B-1, V], drafts: [bs, B-1] -> probs[b, j, drafts[b, j]] as [bs, B-1]."""
    return probs.gather(-1, drafts.long().unsqueeze(-1)).squeeze(-1)


def rejection_verify(
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Exact speculative rejection sampling for drafts sampled from draft_probs [bs, B-1, V].

    target_probs: [bs, B, V]. At the first rejection (block position j = accept_len + 1) the bonus is
    drawn from normalize(max(p_{j-1} - q_j, 0)); if every draft is accepted it is drawn from p_{B-1}.
    """
    _check_shapes(block_tokens, target_probs)
    bs, block = block_tokens.shape
    if draft_probs.shape != (bs, block - 1, target_probs.shape[-1]):
        raise ValueError(f"draft_probs must be [bs, B-1, V], got {tuple(draft_probs.shape)}")
    drafts = block_tokens[:, 1:]  # [bs, B-1]
    p_draft = _draft_token_probs(target_probs[:, :-1], drafts)  # [bs, B-1], p_{j-1}(d_j)
    q_draft = _draft_token_probs(draft_probs, drafts)  # [bs, B-1], q_j(d_j)
    accept_len = _accept_prefix(p_draft, q_draft, generator)  # [bs]
    p_row = _row_at(target_probs, accept_len)  # [bs, V]
    residual = p_row  # all accepted: plain p_{B-1}
    if block > 1:
        rejected = (accept_len < block - 1).view(-1, 1)  # [bs, 1]
        q_row = _row_at(draft_probs, accept_len.clamp(max=block - 2))  # [bs, V], q at the rejection
        residual = torch.where(rejected, (p_row - q_row).clamp(min=0), p_row)
    bonus = _sample_residual(residual, p_row, generator)
    return result_from_accept(block_tokens, accept_len, bonus)


def target_only_verify(
    block_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Rejection sampling for a deterministic draft (q = point mass on each draft token).

    Accept d_j with probability p_{j-1}(d_j); after a rejection the bonus is drawn from p with the
    rejected token's mass removed. Same random stream and output as rejection_verify with one-hot q.
    """
    _check_shapes(block_tokens, target_probs)
    block = block_tokens.shape[1]
    drafts = block_tokens[:, 1:]  # [bs, B-1]
    p_draft = _draft_token_probs(target_probs[:, :-1], drafts)  # [bs, B-1]
    accept_len = _accept_prefix(p_draft, torch.ones_like(p_draft), generator)  # [bs]
    p_row = _row_at(target_probs, accept_len)  # [bs, V]
    residual = p_row
    if block > 1:
        rejected = (accept_len < block - 1).view(-1, 1)  # [bs, 1]
        rejected_tok = drafts.long().gather(1, accept_len.clamp(max=block - 2).view(-1, 1))  # [bs, 1]
        residual = torch.where(rejected, p_row.scatter(-1, rejected_tok, 0.0), p_row)
    bonus = _sample_residual(residual, p_row, generator)
    return result_from_accept(block_tokens, accept_len, bonus)


def _select(use_a: torch.Tensor, a: VerifyResult, b: VerifyResult) -> VerifyResult:
    """Row-wise choice between two results. use_a: [bs] bool."""
    col = use_a.view(-1, 1)
    return VerifyResult(
        accept_len=torch.where(use_a, a.accept_len, b.accept_len),
        bonus=torch.where(use_a, a.bonus, b.bonus),
        committed=torch.where(col, a.committed, b.committed),
        num_committed=torch.where(use_a, a.num_committed, b.num_committed),
    )


def verify(
    block_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Verify a batch mixing greedy and sampled requests.

    Greedy rows (temperature 0) get greedy_verify on the raw logits (top-k/top-p ignored). Sampled rows
    get rejection_verify when draft_probs [bs, B-1, V] is given (it must be the distribution the drafts
    were really sampled from, after the same temperature/top-k/top-p), else target_only_verify.
    When the whole batch is greedy the softmax is skipped; ``sampling.all_greedy`` says so from the host,
    else one host read of ``is_greedy.all()`` decides.
    """
    greedy = greedy_verify(block_tokens, target_logits)
    is_greedy = sampling.is_greedy  # [bs]
    all_greedy = sampling.all_greedy if sampling.all_greedy is not None else bool(is_greedy.all())
    if all_greedy:
        return greedy
    target_probs = probs_from_logits(target_logits, sampling)  # [bs, B, V]
    if draft_probs is not None:
        sampled = rejection_verify(block_tokens, draft_probs, target_probs, generator)
    else:
        sampled = target_only_verify(block_tokens, target_probs, generator)
    return _select(is_greedy, greedy, sampled)
