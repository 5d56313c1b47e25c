"""Shared test fixtures: ``sglang_server``, a factory for real SGLang servers on the dflash CPU platform."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from server_fixture import ACTIVE_SERVERS, ServerFactory


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Tests that change DFLASH_SGLANG_* variables see them; none leaks its settings to the next."""
    from dflash_sglang.settings import settings

    settings.cache_clear()
    yield
    settings.cache_clear()


@pytest.fixture(scope="module")
def sglang_server() -> Iterator[ServerFactory]:
    """Module-scoped factory: ``with sglang_server([...]) as srv`` or ``srv = sglang_server.start([...])``."""
    factory = ServerFactory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """Attach (and print) the log tail of every live server to a failing test's report."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or not ACTIVE_SERVERS:
        return
    for server in ACTIVE_SERVERS:
        tail = server.log_tail(120)
        report.sections.append((f"sglang server log {server.log_path}", tail))
        print(f"\n----- sglang server log tail ({server.log_path}) -----\n{tail}")
