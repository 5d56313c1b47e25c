"""The worker's two hot helpers, chosen once at start-up: Triton kernels on CUDA, torch elsewhere.

* ``inject``: project committed tokens' tap states into every draft layer's K/V and write them at
  their KV-pool slots (``dflash_sglang.kernels.drafter_context_kv_to_pool`` / the drafter's own
  ``context_kv`` + indexed writes, whose arithmetic the kernel's reference reproduces).
* ``greedy_accept``: the accepted prefix and bonus of an all-greedy batch from the target argmax
  (``dflash_sglang.kernels.greedy_accept`` / ``core.kernel_ref.greedy_accept_ref``).

Each pair is pinned to each other by ``tests/kernels`` (interpreter) and ``scripts/gpu_check.py``
(GPU). The kernels are imported only where they run: triton specialises them at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.kernel_ref import greedy_accept_ref
from ..core.verify import VerifyResult

# inject(draft_model, taps [N, T*H], positions [N], slots [N], kv_pool) -> None
InjectFn = Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor, Any], None]
# greedy_accept(block_tokens [bs, B], target_ids [bs, B]) -> VerifyResult
GreedyFn = Callable[[torch.Tensor, torch.Tensor], VerifyResult]


@dataclass(frozen=True)
class KernelSet:
    name: str  # "triton" | "torch"
    inject: InjectFn
    greedy_accept: GreedyFn


def _torch_inject(draft_model: Any, taps: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                  kv_pool: Any) -> None:
    draft_model.inject_context(taps, positions, slots, kv_pool)


def _torch_set() -> KernelSet:
    return KernelSet("torch", _torch_inject, lambda block, ids: greedy_accept_ref(block, ids))


def _triton_set() -> KernelSet:
    from .. import kernels
    from ..core.kernel_ref import stacked_kv_weights

    stacked: dict[int, tuple] = {}  # per draft model: its k/v weights stacked once

    def inject(draft_model: Any, taps: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               kv_pool: Any) -> None:
        if slots.numel() == 0:
            return
        d = draft_model.drafter
        if id(d) not in stacked:
            stacked[id(d)] = stacked_kv_weights(d)
        layers = range(d.cfg.num_hidden_layers)
        with torch.no_grad():
            kernels.drafter_context_kv_to_pool(
                d, taps.to(d.fc.weight.dtype), positions, slots,
                [kv_pool.get_key_buffer(i) for i in layers], [kv_pool.get_value_buffer(i) for i in layers],
                stacked[id(d)])

    return KernelSet("triton", inject, kernels.greedy_accept)


def choose_kernels(device: torch.device | str, head_sharded: bool = False) -> KernelSet:
    """Triton kernels when the worker runs on CUDA and triton imports; the torch path otherwise, and
    where the draft KV cache is head-sharded (tensor parallelism: the kernel writes every head)."""
    if torch.device(device).type == "cuda" and not head_sharded:
        try:
            import triton  # noqa: F401
        except ImportError:
            return _torch_set()
        return _triton_set()
    return _torch_set()
