"""``DFlashCpuPlatform``: SGLang's out-of-tree platform contract served with plain torch on the CPU.

The class is out-of-tree (``PlatformEnum.OOT``) so that SGLang consults its hooks (default attention
backend, speculative support, graph runners) instead of taking the in-tree CPU path, which needs
``sgl_kernel`` CPU ops built for AVX-512/AMX. Device operations come from SGLang's CPU mixin.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

from dflash_sglang.platform import ATTENTION_BACKEND_NAME

# Speculative algorithms whose target-side paths (TARGET_VERIFY, cache-loc helpers) run here.
SUPPORTED_SPECULATIVE_ALGORITHMS = frozenset({"NGRAM", "DFLASH"})


class DFlashCpuPlatform(CpuDeviceMixin, SRTPlatform):
    """CPU device, torch-native attention, eager execution, no graphs, no Triton."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    capabilities = PlatformCapabilities()  # no Triton, no graph capture, no pynccl

    def __init__(self) -> None:
        super().__init__()
        # Cheap and import-safe: only extends SGLang's choice lists so that CLI parsing accepts
        # our backend name. Heavier installation happens in the hooks below, once SGLang is loaded.
        from dflash_sglang.platform.install import register_choices

        register_choices()

    # -- configuration ---------------------------------------------------------------------------
    def apply_server_args_defaults(self, server_args: Any) -> None:
        from dflash_sglang.platform.install import install

        install()
        # SGLang's CPU rule has already picked "intel_amx" (it degrades to torch_native without
        # AMX) when the user named no backend; an explicit choice is kept.
        if server_args.attention_backend in (None, "intel_amx"):
            server_args.attention_backend = ATTENTION_BACKEND_NAME
        server_args.disable_cuda_graph = True
        default_thread_binding(server_args)
        # The overlap scheduler (SGLang's default) is left as the user chose: its streams and events
        # are CPU no-ops (torch.cpu.Stream/Event), so the loop runs with result processing one step
        # behind the forward, exactly as on CUDA (issue 18).

    def init_backend(self) -> None:
        """Called once per worker process (at ``model_runner`` import): install backend + patches."""
        from dflash_sglang.platform.install import install

        install()

    # -- subsystems ------------------------------------------------------------------------------
    def get_default_attention_backend(self) -> str:
        return ATTENTION_BACKEND_NAME

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return ATTENTION_BACKEND_NAME

    def get_compile_backend(self, mode: str | None = None) -> str:
        return "eager"

    def get_speculative_cache_locs_fn(self) -> Any:
        from dflash_sglang.platform.patches.cache_locs import assign_extend_cache_locs_torch

        return assign_extend_cache_locs_torch

    def get_kv_pool_cls(self, *, kind: str) -> type | None:
        if kind != "mha":
            return None  # MLA/DSA pools: in-tree classes (untested here)
        from dflash_sglang.platform.patches.kv_pool import TorchMoveMHATokenToKVPool

        return TorchMoveMHATokenToKVPool

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm.upper() in SUPPORTED_SPECULATIVE_ALGORITHMS

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return backend == ATTENTION_BACKEND_NAME

    def get_device(self, device_id: int | None = 0) -> str:  # type: ignore[override]
        """SGLang's ``utils.get_device`` wants a device string from out-of-tree platforms."""
        return "cpu"

    def is_pin_memory_available(self, device: Any = None) -> bool:
        return False

    def get_group_coordinator_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def get_dispatch_key_name(self) -> str:
        return "native"


THREAD_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"  # SGLang's: "cores of local rank 0|cores of rank 1|..."


def default_thread_binding(server_args: Any) -> None:
    """SGLang's CPU path gives each rank one NUMA node unless ``SGLANG_CPU_OMP_THREADS_BIND`` says
    otherwise, and refuses more ranks than nodes. A small one-node machine running ``--tp 2`` (or two
    ``--nnodes`` launchers) would be refused, so when the variable is unset we split this process's
    cores among the node's ranks (round robin when there are fewer cores than ranks). A value the user
    sets is kept."""
    from sglang.srt.utils.numa_utils import get_cpu_ids_by_node

    world = server_args.tp_size * server_args.pp_size * server_args.dp_size
    if os.environ.get(THREAD_BIND_ENV) or world <= len(get_cpu_ids_by_node()):
        return
    local = max(1, world // max(1, server_args.nnodes))
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= local:
        per = len(cores) // local
        groups = [cores[r * per:(r + 1) * per] for r in range(local)]
    else:
        groups = [[cores[r % len(cores)]] for r in range(local)]
    os.environ[THREAD_BIND_ENV] = "|".join(_cpu_list(g) for g in groups)


def _cpu_list(cores: list[int]) -> str:
    """[0, 1, 2] -> "0-2" (SGLang's range form) when contiguous, else "0,2"."""
    if cores == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))
