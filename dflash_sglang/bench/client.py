"""Streaming ``/generate`` requests timed on the client: TTFT, latency and the final ``meta_info``.

SGLang answers ``"stream": true`` with server-sent events, one ``data: {...}`` line per step (each
carrying the cumulative ``meta_info.completion_tokens``) and a final ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .stats import RequestRecord

DONE = "[DONE]"


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters sent with every request."""

    max_new_tokens: int
    temperature: float  # 0.0 = greedy
    ignore_eos: bool = False

    def as_params(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "ignore_eos": self.ignore_eos}


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """Decoded ``data:`` payloads of an SSE body, up to ``[DONE]``."""
    for raw in response:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == DONE:
            return
        event = json.loads(data)
        if "error" in event:
            err = event["error"]
            raise RuntimeError(f"server error: {err.get('message', err) if isinstance(err, dict) else err}")
        yield event


def _open(base_url: str, payload: dict[str, Any], timeout_s: float) -> Any:
    headers = {"Content-Type": "application/json"}
    body = json.dumps(payload).encode()
    request = urllib.request.Request(f"{base_url}/generate", data=body, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace")[:500]
        raise RuntimeError(f"POST /generate -> {err.code}: {body}") from err


def stream_generate(
    base_url: str, input_ids: list[int], sampling: Sampling, category: str = "all", timeout_s: float = 600.0
) -> RequestRecord:
    """Send one streaming request and time it; raises RuntimeError on an error event or no output."""
    payload = {"input_ids": input_ids, "sampling_params": sampling.as_params(), "stream": True}
    start = time.perf_counter()
    first: float | None = None
    meta: dict[str, Any] = {}
    with _open(base_url, payload, timeout_s) as response:
        for event in _events(response):
            meta = event.get("meta_info", {})
            if first is None and int(meta.get("completion_tokens", 0)) > 0:
                first = time.perf_counter()
    end = time.perf_counter()
    if first is None or not meta:
        raise RuntimeError("stream ended without a generated token")
    return record_from_meta(meta, category, first - start, end - start)


def record_from_meta(meta: dict[str, Any], category: str, ttft_s: float, latency_s: float) -> RequestRecord:
    """A :class:`RequestRecord` from the last chunk's ``meta_info`` (spec fields absent without spec)."""
    return RequestRecord(
        category=category,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta["completion_tokens"]),
        ttft_s=ttft_s,
        latency_s=latency_s,
        verify_ct=int(meta.get("spec_verify_ct", 0) or 0),
        correct_hist=tuple(int(c) for c in meta.get("spec_correct_drafts_histogram") or ()),
        cached_tokens=int(meta.get("cached_tokens", 0) or 0),
    )


def flush_cache(base_url: str, timeout_s: float = 30.0) -> bool:
    """Empty the radix cache (waits up to ``timeout_s`` for the server to go idle); True on success."""
    url = f"{base_url}/flush_cache?timeout={timeout_s:g}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=timeout_s + 10):
            return True
    except (urllib.error.URLError, OSError):
        return False
