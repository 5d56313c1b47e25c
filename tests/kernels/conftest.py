"""Kernel tests run on CPU tensors under the Triton interpreter.

TRITON_INTERPRET must be set before the ``dflash_sglang.kernels`` package is imported (its kernels are
decorated, i.e. specialised to compiled or interpreted, at import time), so this conftest sets it first.
The kernels live in ``dflash_sglang/kernels/``.
"""

from __future__ import annotations

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"

import dflash_sglang.kernels  # noqa: E402,F401
from dflash_sglang.kernels._common import interpreted  # noqa: E402

if not interpreted():
    raise pytest.UsageError("kernels were imported without TRITON_INTERPRET=1; run tests/kernels on its own")
