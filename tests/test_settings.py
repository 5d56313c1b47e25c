"""The typed settings: every DFLASH_SGLANG_* variable parsed once, validated, and documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_sglang.settings import VARS, Settings, SettingsError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults() -> None:
    s = Settings.from_env({})
    assert (s.worker, s.sampling, s.adaptive, s.malloc, s.server_threads) == (
        "ours", "rejection", "auto", "tuned", 1)
    assert s.cache == Path.home() / ".cache" / "dflash-sglang"
    assert s.train_cache == s.cache / "train-data"
    assert s.data == ROOT.parent / "shared" / "data"


def test_values_are_parsed() -> None:
    s = Settings.from_env({"DFLASH_SGLANG_WORKER": "Builtin", "DFLASH_SGLANG_ADAPTIVE": "off",
                           "DFLASH_SGLANG_CACHE": "/tmp/c", "DFLASH_SGLANG_SERVER_THREADS": "2"})
    assert (s.worker, s.adaptive, s.cache, s.server_threads) == ("builtin", "off", Path("/tmp/c"), 2)


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("DFLASH_SGLANG_WORKER", "typo", "use 'ours' or 'builtin'"),
    ("DFLASH_SGLANG_SAMPLING", "greedy", "use 'rejection' or 'target_only'"),
    ("DFLASH_SGLANG_ADAPTIVE", "yes", "use 'auto' or 'on' or 'off'"),
    ("DFLASH_SGLANG_MALLOC", "jemalloc", "use 'tuned' or 'default'"),
    ("DFLASH_SGLANG_SERVER_THREADS", "0", "whole number >= 1"),
    ("DFLASH_SGLANG_SERVER_THREADS", "two", "whole number >= 1"),
])
def test_bad_values_are_one_line_errors(name: str, raw: str, message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)) as err:
        Settings.from_env({name: raw})
    assert str(err.value).startswith(f"{name}={raw!r}") and "\n" not in str(err.value)


def test_every_variable_is_in_the_readme_table() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("| `DFLASH_SGLANG_")]
    documented = {re.match(r"\| `(DFLASH_SGLANG_[A-Z_]+)", line).group(1) for line in table}
    assert documented == {v.name for v in VARS}


def test_no_module_reads_our_variables_directly() -> None:
    """One typed place: nothing else in the package calls os.environ for a DFLASH_SGLANG_* name."""
    offenders = []
    for path in (ROOT / "dflash_sglang").rglob("*.py"):
        if path.name == "settings.py":
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?\s*[\[(]\s*[\"']DFLASH_SGLANG_", text) or re.search(
                r"environ(\.get)?\s*[\[(]\s*[A-Z]+_ENV\b", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_the_training_cache_honours_the_cache_variable(tmp_path: Path) -> None:
    code = "from dflash_sglang.settings import settings; print(settings().train_cache)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"DFLASH_SGLANG_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    assert out.strip() == str(tmp_path / "train-data")
