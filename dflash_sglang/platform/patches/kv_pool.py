"""A KV pool whose slot moves are plain torch indexing instead of the Triton tiled byte copy.

SGLang's ``MHATokenToKVPool`` warms up a Triton copy kernel at construction whenever a speculative
algorithm is on (``enable_kv_cache_copy``) and uses it in ``move_kv_cache`` (accepted-draft KV
compaction). The platform seam ``SRTPlatform.get_kv_pool_cls(kind="mha")`` serves this subclass,
which skips the warm-up and routes moves through SGLang's own ``move_kv_cache_native`` path.
"""

from __future__ import annotations

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool


class TorchMoveMHATokenToKVPool(MHATokenToKVPool):
    """``MHATokenToKVPool`` with ``move_kv_cache`` = per-layer ``buf[tgt] = buf[src]`` (no Triton)."""

    def _init_kv_copy_and_warmup(self) -> None:
        self._kv_copy_config = None
        self.use_native_move_kv_cache = True
