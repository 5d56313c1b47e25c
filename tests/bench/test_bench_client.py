"""The streaming client against a tiny local SSE server that imitates SGLang's ``/generate``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dflash_sglang.bench.client import Sampling, record_from_meta, stream_generate

CHUNK_DELAY_S = 0.05
FINAL_META = {
    "prompt_tokens": 3, "completion_tokens": 4, "spec_verify_ct": 2, "cached_tokens": 1,
    "spec_correct_drafts_histogram": [0, 1, 1],
}  # fmt: skip


class FakeSGLang(BaseHTTPRequestHandler):
    """Streams 4 tokens in 3 chunks (1, 3, 4 cumulative), or an error event for prompt [0]."""

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] is True and body["sampling_params"]["max_new_tokens"] == 4
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if body["input_ids"] == [0]:
            self._event({"error": {"message": "bad prompt"}})
        else:
            for tokens in (1, 3):
                time.sleep(CHUNK_DELAY_S)
                self._event({"text": "x", "meta_info": {"completion_tokens": tokens}})
            self._event({"text": "xyz", "meta_info": FINAL_META})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_stream_generate_times_and_reads_final_meta(base_url: str) -> None:
    r = stream_generate(base_url, [1, 2, 3], Sampling(4, 0.0), category="math", timeout_s=10)
    got = (r.category, r.prompt_tokens, r.completion_tokens, r.verify_ct, r.cached_tokens)
    assert got == ("math", 3, 4, 2, 1)
    assert r.correct_hist == (0, 1, 1)
    assert CHUNK_DELAY_S * 0.9 <= r.ttft_s < r.latency_s
    assert r.latency_s >= 2 * CHUNK_DELAY_S * 0.9


def test_stream_generate_raises_on_error_event(base_url: str) -> None:
    with pytest.raises(RuntimeError, match="bad prompt"):
        stream_generate(base_url, [0], Sampling(4, 0.0), timeout_s=10)


def test_record_from_meta_without_speculation() -> None:
    r = record_from_meta({"completion_tokens": 7, "prompt_tokens": 2}, "all", 0.1, 0.5)
    assert (r.completion_tokens, r.verify_ct, r.correct_hist, r.cached_tokens) == (7, 0, (), 0)
