"""Weighted cross-entropy through the frozen LM head, fused and chunked (the training loss's hot spot).

Plain autograd materialises several [N, V'] buffers per step (logits, their scaled copy, the
log-softmax, a zero-filled gradient, the log-softmax gradient) and streams each through memory: on
the 2-core AVX2 host those element-wise passes cost more than the two head matmuls themselves. Since
the loss is a weighted sum of per-row cross-entropies and nothing follows it, the gradient with
respect to the hidden states is known during the forward pass:

    logits = m * h W^T          p = softmax(logits)          ce_i = logsumexp_i - logits_i[t_i]
    d(sum_i w_i ce_i)/dh_i = m * w_i (p_i - onehot(t_i)) W

so :func:`fused_weighted_ce` computes loss, top-1 hits and that gradient chunk by chunk (a chunk of
logits stays in cache), and its backward only scales the stored gradient. The head weight is frozen
(no gradient). Exact, not an approximation: ``tests/train/test_fused_ce.py`` pins it to the autograd
reference.

Soft labels: given the teacher's hidden states ``t_i`` (the target's own, ``train.teacher``) and a
share ``alpha``, the label becomes ``(1 - alpha) onehot(t_i) + alpha softmax(m t_i W^T)`` over the same
rows, i.e. cross-entropy against the target's distribution (KL up to a constant); the gradient is
``m w_i (p_i - label_i) W``, computed the same way.
"""

from __future__ import annotations

import torch


class _FusedWeightedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, w: torch.Tensor,
                multiplier: float, chunk: int, teacher: torch.Tensor | None,
                alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        n = h.shape[0]
        grad = torch.empty_like(h)  # [n, H] d loss / d h
        hits = torch.empty(n, dtype=torch.bool, device=h.device)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        hw = h.to(weight.dtype)
        for i in range(0, n, chunk):
            t, wc = target[i: i + chunk], w[i: i + chunk].float()
            logits = (hw[i: i + chunk] @ weight.T).float()  # [c, V']
            if multiplier != 1.0:
                logits.mul_(multiplier)
            rows = torch.arange(logits.shape[0], device=h.device)
            top, arg = logits.max(-1)
            hits[i: i + chunk] = arg == t
            picked = logits[rows, t]
            soft = None
            if teacher is not None:  # the target's distribution over the same rows
                t_logits = (teacher[i: i + chunk].to(weight.dtype) @ weight.T).float()
                soft = torch.softmax(t_logits * multiplier, -1)
                picked = (1 - alpha) * picked + alpha * (soft * logits).sum(-1)
            logits.sub_(top[:, None]).exp_()  # unnormalised softmax, in place
            total = logits.sum(-1)
            loss += (wc * (top + total.log() - picked)).sum()
            logits.mul_((wc * multiplier / total)[:, None])  # m w_i p_i
            hard = wc * multiplier * (1 - alpha if soft is not None else 1.0)
            logits[rows, t] -= hard  # m w_i (p_i - onehot) [hard labels]
            if soft is not None:
                logits.sub_(soft.mul_((wc * multiplier * alpha)[:, None]))
            grad[i: i + chunk] = (logits.to(weight.dtype) @ weight).to(h.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(hits)
        return loss, hits

    @staticmethod
    def backward(ctx, g_loss: torch.Tensor, _g_hits: torch.Tensor) -> tuple:
        (grad,) = ctx.saved_tensors
        return grad * g_loss, None, None, None, None, None, None, None


def fused_weighted_ce(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, w: torch.Tensor,
                      multiplier: float = 1.0, chunk: int = 128, teacher: torch.Tensor | None = None,
                      alpha: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """h [n, H], weight [V', H] (frozen), target [n] rows of weight, w [n] loss weights; teacher [n, H]
    (optional, no gradient): hidden states whose distribution over the rows is mixed into the label
    with share ``alpha``.

    -> (sum_i w_i * CE(multiplier * h_i W^T, label_i) as a scalar with a gradient for h,
        top-1 hits [n] bool against ``target``). Divide by the weight total outside for a mean."""
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1]:
        raise ValueError(f"h {tuple(h.shape)} and weight {tuple(weight.shape)}: expected [n, H] and [V', H]")
    if target.shape != (h.shape[0],) or w.shape != (h.shape[0],):
        raise ValueError(f"target {tuple(target.shape)} / w {tuple(w.shape)}: expected [{h.shape[0]}]")
    if teacher is not None and teacher.shape != h.shape:
        raise ValueError(f"teacher {tuple(teacher.shape)}: expected h's shape {tuple(h.shape)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha}: expected a share in [0, 1]")
    return _FusedWeightedCE.apply(h, weight.detach(), target, w.detach(), float(multiplier), int(chunk),
                                  None if teacher is None or alpha == 0 else teacher.detach(), float(alpha))
