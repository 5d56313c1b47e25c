"""Soak: 500 mixed requests at concurrency 32 against one DFLASH server, with faults, and nothing breaks.

The mix (seeded): greedy, sampled, logprobs, stop strings, structured output (regex), streaming
(about 10% of streaming clients hang up mid-stream) and /abort_request calls; prompts from 1 token to
near the context limit.
Afterwards the server is healthy, SGLang's strict idle KV-leak check has found nothing, greedy
requests equal the no-spec server's output, and resident memory grew by less than RSS_BOUND.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# 520 requests with answers of up to 40 tokens took 967 s on 2 cores (2026-12-04); answers of up to
# 24 tokens keep the request count and the mix at a CI-sized cost.
pytestmark = pytest.mark.slow
N_REQUESTS = 500
CONCURRENCY = 32
# Near-limit prompts are near --context-length. At SmolLM2's own 8192 a single such prefill costs about a
# minute of attention compute on 2 cores (no-spec alike) and stalls every decode step meanwhile; 2048
# keeps "near the limit" in the mix at a sixteenth of that.
CONTEXT = 2048
RSS_BOUND = 1 << 30  # bytes of growth allowed over the run (server process group)
# The default block policy (what a user runs); both cores, since the soak server runs alone.
ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", "OMP_NUM_THREADS": "2"}
EXTRA = ["--max-running-requests", "32", "--context-length", str(CONTEXT)]


@dataclass
class Tally:
    ok: int = 0
    aborted: int = 0
    disconnected: int = 0
    errors: list[str] = field(default_factory=list)
    greedy: dict[int, list[int]] = field(default_factory=dict)  # request index -> output ids
    lock: threading.Lock = field(default_factory=threading.Lock)


def plan(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.choices(["greedy", "sampled", "logprobs", "stop", "regex", "stream", "abort"],
                       weights=[30, 18, 12, 10, 5, 17, 8])[0]
    if i % 173 == 5:  # three prompts near the context limit
        n = CONTEXT - 220 - rng.randrange(16)  # room for the longest answer (200 tokens)
    else:
        n = rng.choice([1, 2, rng.randrange(3, 64), rng.randrange(64, 600)])
    ids = [rng.randrange(100, 40000) for _ in range(n)]
    sp: dict[str, Any] = {"max_new_tokens": rng.randrange(4, 24), "temperature": 0.0}
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": sp}
    if kind == "sampled":
        sp.update(temperature=0.8, top_p=0.9)
    elif kind == "logprobs":
        body.update(return_logprob=True, top_logprobs_num=3)
    elif kind == "stop":
        sp.update(stop=["\n", "."])
    elif kind == "regex":
        sp.update(regex=r"[A-Z][a-z]+( [a-z]+){0,6}\.")
    elif kind == "stream":
        body["stream"] = True
    elif kind == "abort":
        body["rid"] = f"soak-abort-{i}"
        sp.update(max_new_tokens=200, ignore_eos=True)
    return {"kind": kind, "body": body, "hangup": kind == "stream" and rng.random() < 0.1}


def _post(base: str, body: dict[str, Any], timeout: float = 900) -> tuple[int, bytes]:
    req = urllib.request.Request(f"{base}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _stream(base: str, body: dict[str, Any], hangup: bool) -> str:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=900)
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return f"status {resp.status}"
    if hangup:
        resp.readline()  # first event, then drop the connection mid-stream
        conn.sock.close()
        return "hangup"
    text = resp.read().decode(errors="replace")
    conn.close()
    return "ok" if "data: [DONE]" in text else f"stream ended without [DONE]: {text[-200:]!r}"


def run_one(base: str, i: int, p: dict[str, Any], tally: Tally) -> None:
    kind, body = p["kind"], p["body"]
    try:
        if kind == "stream":
            outcome = _stream(base, body, p["hangup"])
            with tally.lock:
                if outcome == "ok":
                    tally.ok += 1
                elif outcome == "hangup":
                    tally.disconnected += 1
                else:
                    tally.errors.append(f"{i} stream: {outcome}")
            return
        if kind == "abort":
            threading.Timer(1.0, _abort, (base, body["rid"])).start()
        status, raw = _post(base, body)
        out = json.loads(raw) if raw.startswith(b"{") else {}
        finish = json.dumps(out.get("meta_info", {}).get("finish_reason"))
        with tally.lock:
            if status == 200 and kind == "abort" and "abort" in finish:
                tally.aborted += 1
            elif status == 200:
                tally.ok += 1
                if kind in ("greedy", "regex"):  # both greedy: compared with no-spec below
                    tally.greedy[i] = out["output_ids"]
            elif kind == "abort":
                tally.aborted += 1
            else:
                tally.errors.append(f"{i} {kind}: HTTP {status} {raw[:200]!r}")
    except Exception as err:  # noqa: BLE001 - every failure is counted and reported
        with tally.lock:
            tally.errors.append(f"{i} {kind}: {type(err).__name__}: {err}")


def _abort(base: str, rid: str) -> None:
    req = urllib.request.Request(f"{base}/abort_request", data=json.dumps({"rid": rid}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60).read()
    except (urllib.error.URLError, OSError):
        pass


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in the server's process group."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) == pgid:  # field 5 of /proc/PID/stat: process group
                total += int(stat[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss pages
        except (OSError, IndexError, ValueError):
            continue
    return total


def test_soak_mixed_faulty_traffic(sglang_server, drafter_path) -> None:
    rng = random.Random(20261203)
    plans = [plan(rng, i) for i in range(N_REQUESTS)]
    args = EXTRA + ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter_path)]
    tally = Tally()
    with sglang_server(args, env=ENV, startup_timeout_s=400) as srv:
        run_one(srv.base_url, -1, {"kind": "greedy", "body": plans[0]["body"]}, Tally())  # warm-up
        rss_before = group_rss(srv.process.pid)
        started = time.monotonic()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(lambda ip: run_one(srv.base_url, ip[0], ip[1], tally), enumerate(plans)))
        wall = time.monotonic() - started
        srv.wait_idle()  # idle iterations: SGLang's strict KV-leak check runs
        assert srv.process.poll() is None, "server died after the soak (strict KV leak check?)"
        rss_after = group_rss(srv.process.pid)
        log = srv.log_path.read_text(errors="replace")
        health = urllib.request.urlopen(f"{srv.base_url}/health", timeout=30).status
    print(f"soak: {N_REQUESTS} requests at concurrency {CONCURRENCY} in {wall:.0f} s: ok {tally.ok}, "
          f"aborted {tally.aborted}, disconnected {tally.disconnected}, errors {len(tally.errors)}; "
          f"RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert not tally.errors, tally.errors[:10]
    assert health == 200
    assert "memory leak" not in log.lower() and "Scheduler hit an exception" not in log
    assert tally.aborted > 0 and tally.disconnected > 0 and len(tally.greedy) > 100
    assert rss_after - rss_before < RSS_BOUND, f"RSS grew {(rss_after - rss_before) / 2**20:.0f} MiB"

    regex = [i for i in sorted(tally.greedy) if plans[i]["kind"] == "regex"][:8]
    sample = sorted(set(sorted(tally.greedy)[:40]) | set(regex))
    with sglang_server(EXTRA, startup_timeout_s=400) as plain:
        def ref(i: int) -> list[int]:
            status, raw = _post(plain.base_url, plans[i]["body"])
            assert status == 200
            return json.loads(raw)["output_ids"]

        with ThreadPoolExecutor(8) as pool:
            want = dict(zip(sample, pool.map(ref, sample), strict=True))
    bad = [i for i in sample if tally.greedy[i] != want[i]]
    assert not bad, f"greedy soak requests {bad} differ from the no-spec server"
