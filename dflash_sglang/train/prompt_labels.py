"""Training labels for blocks anchored inside the prompt, from one causal prefill (no decoding).

A self-distilled answer is the target's greedy path, so a block anchored in it is labelled by the
next stored tokens. The prompt is human text: the tokens after a prompt position are not what the
target would write. What one prefill does give is the target's greedy next token after every prompt
prefix, ``greedy[i] = argmax p(. | ids[: i + 1])``. For a block anchored at ``a`` this is exactly the
target's greedy continuation for as long as the text stays on the target's greedy path:

    label at position q = greedy[q - 1]            (q <= prompt_len; ids[q] for q > prompt_len)
    valid while every position a < p < q has ids[p] == label at p (the text equals the greedy token)

so position a + 1 is always labelled, a + 2 when the text's next token is the target's choice, and so
on; inside the answer (the greedy path itself) every label is valid, which is the rule for answer
anchors. SmolLM2-135M agrees with its corpus prompts on 43% of tokens, so a prompt block carries
2.5 labels on average (blocks near a prompt's end run on into its answer): mostly first-draft labels,
the acceptance that matters most, at prefill cost instead of decode cost (~270 prompt tokens/s on one
core in fp32 against 42-100 answer tokens/s of batched distillation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..core.target import HFTarget
from .data import padded_groups


@torch.no_grad()
def prompt_greedy(target: HFTarget, prompts: Sequence[np.ndarray], max_tokens: int = 4096,
                  head_rows: int = 1024) -> list[np.ndarray]:
    """Per prompt [prompt_len]: the target's greedy next token after each prefix (int64). Prompts are
    right-padded into groups of at most ``max_tokens`` padded tokens (causal: padding is inert); the LM
    head runs on ``head_rows`` hidden rows at a time, so no [tokens, vocab] logits tensor is kept."""
    model = target.model
    base = model.base_model
    head = model.get_output_embeddings()
    dev = target.device
    out: list[np.ndarray | None] = [None] * len(prompts)
    for group in padded_groups([len(p) for p in prompts], max_tokens):
        n = len(prompts[group[-1]])
        ids = torch.zeros(len(group), n, dtype=torch.long, device=dev)
        mask = torch.zeros(len(group), n, dtype=torch.long, device=dev)
        for r, i in enumerate(group):
            p = torch.from_numpy(np.asarray(prompts[i], dtype=np.int64))
            ids[r, : len(p)], mask[r, : len(p)] = p.to(dev), 1
        target._captured.clear()
        h = base(input_ids=ids, attention_mask=mask).last_hidden_state  # [g, n, H]
        flat = h.reshape(-1, h.shape[-1])
        best = torch.cat([head(flat[j: j + head_rows]).argmax(-1)
                          for j in range(0, flat.shape[0], head_rows)])
        best = best.view(len(group), n).cpu().numpy()
        for r, i in enumerate(group):
            out[i] = best[r, : len(prompts[i])]
    return out  # type: ignore[return-value]


def greedy_labels(ids: torch.Tensor, prompt_len: int, greedy: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (label [n], on_path [n] bool): ``label[q]`` is the target's greedy token at position q given
    ``ids[:q]``; ``on_path[q]`` says the text has it there (``ids[q] == label[q]``). Without ``greedy``
    (answer-only training) the labels are the ids themselves, all on the path. Position 0 has no
    prefix: label = ids[0], on the path."""
    label = ids.clone()
    if greedy is not None:
        if greedy.shape != (prompt_len,):
            raise ValueError(f"greedy {tuple(greedy.shape)} for a prompt of {prompt_len} tokens")
        label[1: prompt_len + 1] = greedy[: min(prompt_len, ids.shape[0] - 1)]
    return label, label == ids
