"""Fixtures for the SGLang glue: the default drafter and chat-templated Spec-Bench prompt ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from parity import COMMON, NOSPEC_ARGS, NOSPEC_ENV, STRICT, readme_dflash_args
from server_fixture import ServerFactory

from dflash_sglang.core.random_drafter import build_random_drafter
from dflash_sglang.models import fetch_model

TRAINED = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash-b16"
_PARITY: dict[str, object] = {}  # "factory": the live session pool; "last": nodeid of its last user


def _uses_parity(item: pytest.Item) -> bool:
    return "parity_servers" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules using the session's shared no-spec/DFLASH pair run back to back, at the first one's place,
    so the pair can stop after its last user: left up, its ~7 GB sat beside the soak's and the
    tensor-parallel modules' servers on the 24 GiB machine (the CI OOM of 2026-12-06)."""
    mods: dict[str, list[pytest.Item]] = {}
    for it in items:
        mods.setdefault(it.nodeid.split("::")[0], []).append(it)
    order = list(mods)
    users = [m for m in order if any(_uses_parity(i) for i in mods[m])]
    if len(users) < 2:
        return
    first = order.index(users[0])
    rest = [m for m in order if m not in users]
    items[:] = [i for m in rest[:first] + users + rest[first:] for i in mods[m]]


def pytest_collection_finish(session: pytest.Session) -> None:
    last = [i.nodeid for i in session.items if _uses_parity(i)]
    _PARITY["last"] = last[-1] if last else None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    factory = _PARITY.get("factory")
    if isinstance(factory, ServerFactory) and item.nodeid == _PARITY.get("last"):
        factory.close()  # idempotent; a later user would simply start the pair again


@pytest.fixture(scope="session")
def target_path() -> Path:
    return fetch_model("smollm2-135m", log=lambda _m: None)


@pytest.fixture(scope="session")
def drafter_path(target_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped trained drafter when present, else a random one (lossless either way)."""
    if (TRAINED / "config.json").is_file():
        return TRAINED
    return build_random_drafter(target_path, tmp_path_factory.mktemp("drafter") / "rand16", block_size=16)


@pytest.fixture(scope="session")
def prompt_ids(target_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    from dflash_sglang.prompts import chat_ids, load_prompts, spec_bench_path

    tok = AutoTokenizer.from_pretrained(str(target_path))
    prompts = load_prompts(spec_bench_path())
    picked, per_cat = [], {}
    for p in prompts:  # a spread of categories
        if per_cat.get(p.category, 0) < 2:
            per_cat[p.category] = per_cat.get(p.category, 0) + 1
            picked.append(p)
    return [chat_ids(tok, p.text) for p in picked[:16]]


@pytest.fixture(scope="session")
def parity_servers() -> Iterator[ServerFactory]:
    """Session-scoped: the request-parity and structured-output modules share one no-spec and one DFLASH
    server (two start-ups fewer; idle servers sleep, so they cost memory, not CPU)."""
    factory = ServerFactory()
    _PARITY["factory"] = factory
    try:
        yield factory
    finally:
        factory.close()
        _PARITY.pop("factory", None)


@pytest.fixture(scope="session")
def nospec(parity_servers: ServerFactory):  # noqa: ANN201
    return parity_servers.start(NOSPEC_ARGS, env=NOSPEC_ENV)


@pytest.fixture(scope="session")
def dflash(parity_servers: ServerFactory, drafter_path: Path):  # noqa: ANN201
    """DFLASH started with the README's own command (the block comes from the drafter's config)."""
    return parity_servers.start(COMMON + readme_dflash_args(drafter_path), env=STRICT)
