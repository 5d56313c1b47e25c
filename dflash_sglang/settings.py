"""Every ``DFLASH_SGLANG_*`` environment variable, read and validated in one place.

``settings()`` parses the environment once per process into a frozen :class:`Settings`; a bad value
is a one-line :class:`SettingsError` naming the variable and the values it accepts. Each variable is
documented in the README's environment table (a test checks that every one appears there).
Stdlib only: the core, the glue and the CLIs all import it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER_ENV = "DFLASH_SGLANG_WORKER"
SAMPLING_ENV = "DFLASH_SGLANG_SAMPLING"
ADAPTIVE_ENV = "DFLASH_SGLANG_ADAPTIVE"
MALLOC_ENV = "DFLASH_SGLANG_MALLOC"
CACHE_ENV = "DFLASH_SGLANG_CACHE"
DATA_ENV = "DFLASH_SGLANG_DATA"
THREADS_ENV = "DFLASH_SGLANG_SERVER_THREADS"
GRAMMAR_DRAFT_ENV = "DFLASH_SGLANG_GRAMMAR_DRAFT"
HOST_READ_AUDIT_ENV = "DFLASH_SGLANG_HOST_READ_AUDIT"
LOOKUP_ENV = "DFLASH_SGLANG_LOOKUP"


class SettingsError(ValueError):
    """A DFLASH_SGLANG_* variable holds a value we do not accept (one line)."""


@dataclass(frozen=True)
class Var:
    name: str  # the environment variable
    field: str  # the Settings attribute it fills
    default: str  # raw default ("" = computed by the parser)
    parse: Callable[[str, str], Any]  # (name, raw) -> value, raising SettingsError


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise SettingsError(f"{name}={raw!r}: use {' or '.join(repr(a) for a in allowed)}")
        return value

    return parse


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SettingsError(f"{name}={raw!r}: use a whole number >= 1")
    return value


def _cache(name: str, raw: str) -> Path:
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "dflash-sglang"


def _data(name: str, raw: str) -> Path:
    return Path(raw).expanduser() if raw else Path(__file__).resolve().parents[2] / "shared" / "data"


VARS: tuple[Var, ...] = (
    Var(WORKER_ENV, "worker", "ours", _choice("ours", "builtin")),
    Var(SAMPLING_ENV, "sampling", "rejection", _choice("rejection", "target_only")),
    Var(ADAPTIVE_ENV, "adaptive", "auto", _choice("auto", "on", "off")),
    Var(MALLOC_ENV, "malloc", "tuned", _choice("tuned", "default")),
    Var(CACHE_ENV, "cache", "", _cache),
    Var(DATA_ENV, "data", "", _data),
    Var(THREADS_ENV, "server_threads", "1", _positive_int),
    Var(GRAMMAR_DRAFT_ENV, "grammar_draft", "on", _choice("on", "off")),
    Var(HOST_READ_AUDIT_ENV, "host_read_audit", "off", _choice("on", "off")),
    Var(LOOKUP_ENV, "lookup", "auto", _choice("auto", "on", "off")),
)


@dataclass(frozen=True)
class Settings:
    worker: str  # "ours" | "builtin": which DFLASH worker SGLang constructs
    sampling: str  # "rejection" | "target_only": how sampled requests are verified
    adaptive: str  # "auto" | "on" | "off": the adaptive block policy (auto: on where steps are host-timed)
    malloc: str  # "tuned" | "default": glibc malloc settings of the CPU platform
    cache: Path  # models, converted checkpoints and training data caches
    data: Path  # prompt data (Spec-Bench, GSM8K train, ...)
    server_threads: int  # OpenMP threads of a server started by the bench harness or the tests
    grammar_draft: str  # "on" | "off": constrained requests draft under their grammar's masks
    host_read_audit: str  # "on" | "off": log the host reads (syncs) of every decode step
    lookup: str  # "auto" | "on" | "off": context lookup drafts (core.lookup; auto: on where the host
    # read of the committed tokens costs no device sync, i.e. on CPU)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(**{v.field: v.parse(v.name, env.get(v.name) or v.default) for v in VARS})

    @property
    def train_cache(self) -> Path:
        return self.cache / "train-data"


@functools.cache
def settings() -> Settings:
    """The process's settings, parsed from the environment on first use."""
    return Settings.from_env(os.environ)


def reload_settings() -> Settings:
    """Forget the parsed settings (tests that change the environment) and parse again."""
    settings.cache_clear()
    return settings()
