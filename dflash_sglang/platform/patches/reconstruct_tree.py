"""NGRAM verify metadata from a tree mask, in torch; makes ``reconstruct_tree`` importable without sgl_kernel.

``sglang.kernels.ops.speculative.reconstruct_tree`` does ``from sgl_kernel.speculative import
reconstruct_indices_from_tree_mask`` at import time on anything that is not CUDA/HIP/XPU, and
``sgl_kernel`` cannot load without a GPU driver. No seam exists, so :func:`apply` imports the module
with a stand-in ``sgl_kernel.speculative`` that exports the torch op below, restores ``sys.modules``,
and rebinds the module global to the torch op.

Contract (per batch ``b``; ``n = draft_token_num``; ``tree_mask`` flat bool ``[bs, n, n]``,
``mask[b, i, j]`` = node ``j`` is ``i`` or an ancestor of ``i``), written in place:
- ``positions[b*n + i]``             = verified_seq_len[b] + #strict ancestors of i
- ``retrieve_index[b, i]``           = b*n + i
- ``retrieve_next_token[b, i]``      = smallest child k > i of i, else -1
- ``retrieve_next_sibling[b, i]``    = smallest k > i with the same parent as i, else -1 (roots: -1)
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator

import torch

from . import require_pinned

TARGET_MODULE = "sglang.kernels.ops.speculative.reconstruct_tree"
TARGET_SYMBOL = "reconstruct_indices_from_tree_mask"  # module global the wrapper calls
WRAPPER_SYMBOL = "reconstruct_indices_from_tree_mask_func"


def reconstruct_indices_from_tree_mask_torch(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Torch version of the sgl_kernel op (see module docstring); mutates the four outputs."""
    if batch_size == 0:
        return
    n, dev = draft_token_num, tree_mask.device
    mask = tree_mask.reshape(-1)[: batch_size * n * n].view(batch_size, n, n).to(torch.bool)
    idx = torch.arange(n, device=dev)
    strict = mask & (idx[None, None, :] < idx[None, :, None])  # [bs, i, j]: j strict ancestor of i
    depth = strict.sum(-1)  # [bs, n]
    positions.view(-1)[: batch_size * n].copy_((depth + verified_seq_len[:batch_size, None]).view(-1))
    rows = torch.arange(batch_size, device=dev)[:, None] * n + idx[None, :]
    retrieve_index.view(-1)[: batch_size * n].copy_(rows.view(-1))
    # parent[i] = largest strict ancestor (the deepest one), -1 for roots.
    parent = torch.where(strict, idx[None, None, :], torch.full_like(strict, -1, dtype=torch.long)).amax(-1)
    big = torch.full((batch_size, n, n), n, dtype=torch.long, device=dev)
    rows_k = idx[None, :, None].expand(batch_size, n, n)  # k along dim 1
    is_child = parent[:, :, None] == idx[None, None, :]  # [bs, k, i]: k's parent is i
    first_child = torch.where(is_child, rows_k, big).amin(1)  # [bs, i]
    same_parent = (parent[:, :, None] == parent[:, None, :]) & (idx[None, :, None] > idx[None, None, :])
    first_sibling = torch.where(same_parent, rows_k, big).amin(1)  # [bs, i]: smallest k > i, same parent
    first_sibling = torch.where(parent >= 0, first_sibling, torch.full_like(first_sibling, n))
    minus_one = torch.full_like(first_child, -1)
    next_token = torch.where(first_child < n, first_child, minus_one)
    retrieve_next_token.view(batch_size, -1)[:, :n].copy_(next_token)
    retrieve_next_sibling.view(batch_size, -1)[:, :n].copy_(
        torch.where(first_sibling < n, first_sibling, minus_one)
    )


@contextlib.contextmanager
def _stand_in_sgl_kernel() -> Iterator[None]:
    """Expose ``sgl_kernel.speculative.reconstruct_indices_from_tree_mask`` = torch op, then restore."""
    names = ("sgl_kernel", "sgl_kernel.speculative")
    saved = {name: sys.modules.get(name) for name in names}
    speculative = types.ModuleType("sgl_kernel.speculative")
    setattr(speculative, TARGET_SYMBOL, reconstruct_indices_from_tree_mask_torch)
    if saved["sgl_kernel"] is None:
        package = types.ModuleType("sgl_kernel")
        package.__path__ = []  # a package, so that the submodule import resolves from sys.modules
        sys.modules["sgl_kernel"] = package
    sys.modules["sgl_kernel.speculative"] = speculative
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def apply() -> None:
    """Import the target module without sgl_kernel and point it at the torch op (idempotent)."""
    require_pinned()
    module = sys.modules.get(TARGET_MODULE)
    if module is None:
        with _stand_in_sgl_kernel():
            module = importlib.import_module(TARGET_MODULE)
    setattr(module, TARGET_SYMBOL, reconstruct_indices_from_tree_mask_torch)
