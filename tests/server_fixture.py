"""Test-side name for the SGLang server launcher, which lives in ``dflash_sglang.bench.server``.

Kept so ``tests/conftest.py`` and test modules can ``from server_fixture import ...`` as before;
every name but ``ServerFactory`` (the fixtures' server pool, defined here so both conftest files share
it) is the package's own object (``ACTIVE_SERVERS`` is the same list).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from dflash_sglang.bench.server import (
    ACTIVE_SERVERS,
    BASE_SERVER_ARGS,
    DEFAULT_STARTUP_TIMEOUT_S,
    FATAL_LOG_MARKER,
    OVERLAP_OFF,
    PLATFORM_NAME,
    ServerClient,
    default_model_path,
    free_port,
    launch_sglang_server,
    server_command,
)
from dflash_sglang.settings import THREADS_ENV


class ServerFactory:
    """``factory(extra_args)`` -> context manager; ``factory.start(extra_args)`` -> client kept until
    the end of the owning fixture scope (servers started with the same args and environment are reused)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._started: dict[tuple[str, ...], ServerClient] = {}

    def __call__(self, extra_args: Sequence[str] = (), **kwargs: Any) -> contextlib.AbstractContextManager:
        return launch_sglang_server(extra_args, **kwargs)

    def start(self, extra_args: Sequence[str] = (), **kwargs: Any) -> ServerClient:
        # The environment is part of the key: a server started without DFLASH_SGLANG_HOST_READ_AUDIT must
        # not stand in for one that asked for it (CI stop 27 failed exactly so).
        env = kwargs.get("env") or {}
        key = (*extra_args, *sorted(f"{k}={v}" for k, v in env.items()))
        if key not in self._started:
            self._started[key] = self._stack.enter_context(launch_sglang_server(extra_args, **kwargs))
        return self._started[key]

    def close(self) -> None:
        self._stack.close()
        self._started.clear()
        self._stack = contextlib.ExitStack()


__all__ = [
    "ACTIVE_SERVERS",
    "BASE_SERVER_ARGS",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "FATAL_LOG_MARKER",
    "OVERLAP_OFF",
    "PLATFORM_NAME",
    "THREADS_ENV",
    "ServerClient",
    "ServerFactory",
    "default_model_path",
    "free_port",
    "launch_sglang_server",
    "server_command",
]
