"""Launch a real ``python -m sglang.launch_server`` on the dflash CPU platform (benchmarks and tests).

``launch_sglang_server(extra_args)`` is a context manager yielding a :class:`ServerClient`; the
pytest fixture ``sglang_server`` (see ``tests/conftest.py``, which re-exports this module through
``tests/server_fixture.py``) hands it out as a factory so a test module can start one server per
configuration (e.g. ``["--speculative-algorithm", "NGRAM"]``); ``dflash-sglang bench`` starts one
server per method, one after another.

Invariants: the server binds 127.0.0.1 on a free port, runs in its own process group (stopped
with ``killpg`` at exit), and logs to a file whose tail is printed when a test using it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import settings

PLATFORM_NAME = "dflash_cpu"
DEFAULT_STARTUP_TIMEOUT_S = 300.0
FATAL_LOG_MARKER = "Scheduler hit an exception"
# Small, deterministic CPU server: fp32 SmolLM2, SGLang's default (overlap) scheduler, no graphs,
# bounded KV pool. Add OVERLAP_OFF to run the non-overlap loop.
OVERLAP_OFF = "--disable-overlap-schedule"
BASE_SERVER_ARGS: tuple[str, ...] = (
    "--dtype", "float32",
    "--disable-cuda-graph",
    "--mem-fraction-static", "0.8",  # of host RAM; the KV pool is capped below
    "--max-total-tokens", "16384",
    "--max-running-requests", "16",
    "--random-seed", "0",
    "--log-level", "info",
    # SGLang's scheduler polls in a busy loop when idle: an idle test or bench server would burn a whole
    # core (measured: 95% CPU for minutes) and halve the speed of the server under test on 2 cores.
    "--sleep-on-idle",
)  # fmt: skip

# Servers alive in this process; the conftest failure hook attaches their log tails.
ACTIVE_SERVERS: list[ServerClient] = []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_model_path() -> str:
    from dflash_sglang.models import fetch_model

    return str(fetch_model("smollm2-135m"))


def _post_json(url: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"POST {url} -> {err.code}: {err.read().decode(errors='replace')}") from err


@dataclass
class ServerClient:
    """A running server: where it listens, its log, and thin JSON helpers."""

    base_url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)
    request_timeout_s: float = 300.0

    def generate(
        self,
        text: str | None = None,
        *,
        input_ids: list[int] | None = None,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        ignore_eos: bool = False,
        **extra: Any,
    ) -> dict[str, Any]:
        """POST /generate for one prompt; returns the JSON (``output_ids``, ``meta_info``...)."""
        sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": ignore_eos}
        payload: dict[str, Any] = {"sampling_params": sampling, **extra}
        if input_ids is not None:
            payload["input_ids"] = input_ids
        else:
            payload["text"] = text
        return _post_json(f"{self.base_url}/generate", payload, self.request_timeout_s)

    def chat(
        self, messages: list[dict[str, str]], *, max_tokens: int = 32, temperature: float = 0.0, **extra: Any
    ) -> dict[str, Any]:
        """POST /v1/chat/completions; returns the OpenAI-style JSON."""
        payload = {
            "model": "default",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            **extra,
        }
        return _post_json(f"{self.base_url}/v1/chat/completions", payload, self.request_timeout_s)

    def get_json(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=30) as response:
            return json.loads(response.read())

    def in_flight(self) -> int:
        """Running + waiting requests, from SGLang's ``/v1/loads``."""
        return requests_in_flight(self.get_json("/v1/loads"))

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 120.0,
                 poll_s: float = 0.2) -> None:
        """Polls ``condition`` until it holds; raises (naming ``what``) on timeout or if the server died."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"server exited while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(poll_s)

    def wait_idle(self, timeout_s: float = 120.0, idle_polls: int = 5) -> None:
        """Until the scheduler has reported no request in flight ``idle_polls`` times in a row: it has
        then run idle iterations, where SGLang's strict KV-leak check runs."""
        streak = [0]

        def idle() -> bool:
            streak[0] = streak[0] + 1 if self.in_flight() == 0 else 0
            return streak[0] >= idle_polls

        self.wait_for(idle, "an idle scheduler", timeout_s)

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as err:
            return f"<no log: {err}>"


def requests_in_flight(node: Any) -> int:
    """Sum of ``num_running_reqs`` and ``num_waiting_reqs`` anywhere in a ``/v1/loads`` answer."""
    if isinstance(node, dict):
        return sum(int(v) if k in ("num_running_reqs", "num_waiting_reqs") and isinstance(v, int)
                   else requests_in_flight(v) for k, v in node.items())
    if isinstance(node, list):
        return sum(requests_in_flight(v) for v in node)
    return 0


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_healthy(client: ServerClient, timeout_s: float) -> None:
    """Poll /health until 200; fail fast (with the log tail) if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.process.poll() is not None:
            raise RuntimeError(
                f"sglang server exited with {client.process.returncode} during start-up; "
                f"log tail:\n{client.log_tail()}"
            )
        if _healthy(client.base_url):
            return
        if FATAL_LOG_MARKER in client.log_tail(200):  # the launcher lingers for crash diagnostics
            raise RuntimeError(f"sglang server failed during start-up; log tail:\n{client.log_tail()}")
        time.sleep(1.0)
    raise TimeoutError(f"sglang server not healthy after {timeout_s:.0f}s; log tail:\n{client.log_tail()}")


def _stop(process: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever is left after ``grace_s``."""
    if process.poll() is not None:
        return
    pgid = process.pid  # start_new_session=True: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def server_command(model_path: str, port: int, extra_args: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", model_path,
        "--host", "127.0.0.1",
        "--port", str(port),
        *BASE_SERVER_ARGS,
        *extra_args,
    ]  # fmt: skip


def _server_env(env: dict[str, str] | None) -> dict[str, str]:
    return {
        # TRITON_INTERPRET belongs to in-process kernel tests; a server never runs the interpreter.
        **{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
        "SGLANG_PLATFORM": PLATFORM_NAME,
        # One intra-op thread unless told otherwise: on a small shared CPU, OpenMP spin-waiting
        # across processes (server, test client, HF reference) is several times slower.
        "OMP_NUM_THREADS": str(settings().server_threads),
        **(env or {}),
    }


@contextlib.contextmanager
def launch_follower_node(
    extra_args: Sequence[str],
    *,
    model_path: str | None = None,
    log_path: Path,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A launcher with ``--node-rank`` >= 1 (its args name it): it runs its ranks' schedulers and no
    HTTP server, so there is nothing to wait for; the rank-0 launcher becomes healthy once every node
    has joined. Always stopped on exit."""
    cmd = server_command(model_path or default_model_path(), free_port(), extra_args)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=_server_env(env), start_new_session=True
        )
    try:
        yield process
    finally:
        _stop(process)


@contextlib.contextmanager
def launch_sglang_server(
    extra_args: Sequence[str] = (),
    *,
    model_path: str | None = None,
    log_dir: Path | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Iterator[ServerClient]:
    """Start a server on the dflash CPU platform, yield a client once healthy, always stop it."""
    port = free_port()
    log_root = log_dir or Path(tempfile.mkdtemp(prefix="dflash-sglang-server-"))
    log_path = log_root / f"server-{port}.log"
    cmd = server_command(model_path or default_model_path(), port, extra_args)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=_server_env(env), start_new_session=True
        )
    client = ServerClient(f"http://127.0.0.1:{port}", log_path, process, list(cmd))
    ACTIVE_SERVERS.append(client)
    try:
        _wait_healthy(client, startup_timeout_s)
        yield client
    finally:
        _stop(process)
        ACTIVE_SERVERS.remove(client)
