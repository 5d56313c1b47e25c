"""Test-side name for the SGLang server launcher, which lives in ``dflash_sglang.bench.server``.

Kept so ``tests/conftest.py`` and test modules can ``from server_fixture import ...`` as before;
every name is the package's own object (``ACTIVE_SERVERS`` is the same list).
"""

from __future__ import annotations

from dflash_sglang.bench.server import (
    ACTIVE_SERVERS,
    BASE_SERVER_ARGS,
    DEFAULT_STARTUP_TIMEOUT_S,
    FATAL_LOG_MARKER,
    PLATFORM_NAME,
    ServerClient,
    default_model_path,
    free_port,
    launch_sglang_server,
    server_command,
)
from dflash_sglang.settings import THREADS_ENV

__all__ = [
    "ACTIVE_SERVERS",
    "BASE_SERVER_ARGS",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "FATAL_LOG_MARKER",
    "PLATFORM_NAME",
    "THREADS_ENV",
    "ServerClient",
    "default_model_path",
    "free_port",
    "launch_sglang_server",
    "server_command",
]
