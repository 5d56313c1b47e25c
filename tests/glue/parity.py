"""Helpers shared by the request-parity and structured-output tests: the two servers' arguments and
thin HTTP / OpenAI clients (the servers themselves are the session fixtures ``nospec`` and ``dflash``
in ``conftest.py``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# A leaked KV slot crashes the server; the adaptive block policy is off, so every decode step
# verifies the drafter's full block and the per-position logic is exercised.
STRICT = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", "DFLASH_SGLANG_ADAPTIVE": "off"}
NOSPEC_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
COMMON = ["--enable-custom-logit-processor"]


def readme_dflash_args(drafter: Path) -> list[str]:
    """The README's command: no --speculative-num-draft-tokens, the block comes from the drafter."""
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter)]


def client(srv):  # noqa: ANN001, ANN201
    import openai

    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", timeout=300, max_retries=0)


def post(srv, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:  # noqa: ANN001
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{srv.base_url}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace")
        try:
            return err.code, json.loads(text)
        except json.JSONDecodeError:
            return err.code, text
