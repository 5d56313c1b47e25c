"""Counting host reads of tensor values (device-to-host synchronisations on an accelerator).

A decode step that reads a tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``,
``int(t)``, ``.cpu()``, ``.numpy()``) waits for the device to finish everything queued before it, which
serialises the overlap scheduler's pipeline. ``count_host_reads`` patches those methods on
``torch.Tensor`` for the duration of a region and counts the calls made from the calling thread (other
threads are not counted). On the CPU a read costs nothing extra, yet each one is where a CUDA step would
sync, so the count is the same on both.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
_LOCK = threading.Lock()


class HostReads(Counter[str]):
    """Reads by kind (``n["item"]``, ``n.total()``) and by call site (``n.sites["verify.py:verify"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()


def _site(depth: int) -> str:
    """file:function of the first caller outside torch, ``depth`` frames up from the wrapper."""
    frame = sys._getframe(depth)
    while frame.f_back is not None and f"{os.sep}torch{os.sep}" in frame.f_code.co_filename:
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """with count_host_reads() as n: ... -> n["item"], n["__bool__"], ... (n.total() for all)."""
    counts = HostReads()
    owner = threading.get_ident()
    saved = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == owner:
                counts[name] += 1
                counts.sites[_site(2)] += 1
            return original(self, *args, **kwargs)

        return wrapper

    with _LOCK:  # one counting region at a time: the patches are process-wide
        try:
            for name in HOST_READS:
                setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
            yield counts
        finally:
            for name, original in saved.items():
                if original is None:
                    delattr(torch.Tensor, name)  # inherited from TensorBase: drop the override
                else:
                    setattr(torch.Tensor, name, original)
