"""Greedy tree verification (``spec_tree.verify_tree_greedy_func``) in torch/Python.

SGLang rejects out-of-tree platforms on this path (``reject_out_of_tree_path``); :func:`apply`
REPLACEs it via SGLang's HookRegistry. Contract, per request ``b`` (``n`` draft nodes, ``S`` =
``accept_index.shape[1]`` accept slots; node 0 is the last verified token, ``retrieve_*`` hold
flat indices ``b*n + i`` / per-request child and sibling links, -1 = none):
walk from node 0; at each level look for the child of the current node whose candidate token
equals the target's argmax at the current node; on a match record it and descend, else stop.
Writes ``predicts[flat] = target`` for every accepted node plus the final (bonus) node,
``accept_index[b, :1 + m]`` (flat indices) and ``accept_token_num[b] = m``.
"""

from __future__ import annotations

import torch

from . import hook_replace, require_pinned

TARGET = "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_func"


def _walk(
    cand: list[int], index: list[int], child: list[int], sibling: list[int], target: list[int], slots: int
):
    """One request: (accepted flat indices incl. the root, tokens written per flat index)."""
    last, cur = index[0], 0
    accepted, writes = [last], {}
    for _ in range(1, slots):
        cur = child[cur]
        want = target[last % len(cand)]
        while cur != -1 and cand[cur] != want:
            cur = sibling[cur]
        if cur == -1:
            break
        writes[last] = want
        last = index[cur]
        accepted.append(last)
    writes[last] = target[last % len(cand)]
    return accepted, writes


def verify_tree_greedy_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    topk: int = -1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """candidates/retrieve_*/target_predict [bs, n]; predicts [bs*n]; accept_index [bs, S]."""
    bs, n = candidates.shape
    slots = accept_index.shape[1]
    cand, index = candidates.tolist(), retrieve_index.view(bs, n).tolist()
    child, sibling = retrieve_next_token.view(bs, n).tolist(), retrieve_next_sibling.view(bs, n).tolist()
    target = target_predict.view(bs, n).tolist()
    for b in range(bs):
        accepted, writes = _walk(cand[b], index[b], child[b], sibling[b], target[b], slots)
        accept_index[b, : len(accepted)] = torch.tensor(accepted, dtype=accept_index.dtype)
        accept_token_num[b] = len(accepted) - 1
        flat = torch.tensor(list(writes), dtype=torch.int64)
        predicts[flat] = torch.tensor(list(writes.values()), dtype=predicts.dtype)
    return predicts, accept_index, accept_token_num


def apply() -> None:
    require_pinned()
    hook_replace(TARGET, verify_tree_greedy_torch)
