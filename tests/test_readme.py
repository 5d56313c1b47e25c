"""The README's commands are real: every ``dflash-sglang`` command parses with the CLI as written, and
its CPU server command (with DFLASH, no block size: the drafter's) starts and serves, as a user types it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dflash_sglang.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """Every command line of the README's bash blocks, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _argv(cmd: str) -> list[str]:
    cmd = cmd.replace("$(dflash-sglang models fetch)", "/target").replace("$T", "/target")
    return shlex.split(re.sub(r"^[A-Z_]+=\S+\s+", "", cmd))


def test_every_cli_command_in_the_readme_parses() -> None:
    cli = [c for c in readme_commands() if re.match(r"^(T=\S+\s+)?dflash-sglang ", c)]
    assert len(cli) >= 7, cli  # models fetch, random-drafter, generate, train-corpus, distill x2, train
    for cmd in cli:
        argv = _argv(cmd.split("T=$(dflash-sglang models fetch)")[-1].strip())
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as err:
            raise AssertionError(f"README command does not parse: {cmd}") from err


def readme_server_command(port: int) -> tuple[dict[str, str], list[str]]:
    """The README's CPU server command, with its optional DFLASH part, on ``port``."""
    cmd = next(c for c in readme_commands() if "sglang.launch_server" in c and "dflash_cpu" in c)
    env = dict(re.findall(r"([A-Z_]+)=(\S+)\s", cmd.split("python")[0] + " "))
    cmd = cmd.replace("[", "").replace("]", "")
    argv = _argv(cmd.split(" ", len(env))[-1])
    argv[argv.index("--port") + 1] = str(port)
    return env, argv


@pytest.mark.slow
def test_readme_server_command_starts_with_the_drafters_block_and_serves(tmp_path: Path) -> None:
    from dflash_sglang.bench.server import free_port
    from dflash_sglang.models import fetch_model

    port = free_port()
    env, argv = readme_server_command(port)
    assert "--speculative-algorithm" in argv and "--speculative-num-draft-tokens" not in argv
    argv[argv.index("--model-path") + 1] = str(fetch_model("smollm2-135m", log=lambda _m: None))
    argv = [sys.executable if a == "python" else a for a in argv]
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env})
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if urllib.request.urlopen(f"{base}/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "README server never became healthy"
            time.sleep(1.0)
        import json

        body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 8}}).encode()
        req = urllib.request.Request(f"{base}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=300).read())
        assert out["meta_info"]["completion_tokens"] == 8 and out["meta_info"]["spec_verify_ct"] > 0
        assert "dflash-sglang: our DFlash worker runs (block 16" in log.read_text(errors="replace")
    finally:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
