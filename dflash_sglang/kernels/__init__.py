"""Triton kernels of the DFlash GPU path (contracts: docs/gpu_path.md, references: core/kernel_ref.py).

On a machine without a GPU the kernels run on CPU tensors under the Triton interpreter: set
``TRITON_INTERPRET=1`` before anything imports triton (the kernels are specialised at import time).
"""

from .context_kv import context_kv_to_pool, drafter_context_kv_to_pool
from .greedy_accept import greedy_accept
from .rejection import chain_rejection

__all__ = ["chain_rejection", "context_kv_to_pool", "drafter_context_kv_to_pool", "greedy_accept"]
