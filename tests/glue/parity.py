"""Helpers shared by the request-parity and structured-output tests: the two servers' arguments and
thin HTTP / OpenAI clients (the servers themselves are the session fixtures ``nospec`` and ``dflash``
in ``conftest.py``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

# A leaked KV slot crashes the server; the adaptive block policy is off, so every decode step
# verifies the drafter's full block and the per-position logic is exercised.
STRICT = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", "DFLASH_SGLANG_ADAPTIVE": "off"}
NOSPEC_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
COMMON = ["--enable-custom-logit-processor"]
# The no-spec reference runs SGLang's non-overlap loop: under overlap, SGLang 0.5.23's no-spec penalizer
# counts output_ids[-1] before the previous step is processed, i.e. one token late and, at the first
# decode step, the prompt's last token (ScheduleBatch.cumulate_penalty_output_tokens). Penalised
# requests then differ from the penalties' definition; the non-overlap loop applies them exactly, and
# DFLASH (overlap on, SGLang's default) must equal that. Without penalties both loops agree.
NOSPEC_ARGS = [*COMMON, "--disable-overlap-schedule"]


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


def same_distribution_pvalue(spec: Counter, plain: Counter, n: int, min_count: int = 10) -> float:
    """Chi-square test that two samples of ``n`` outcomes each come from one distribution: outcomes
    seen at least ``min_count`` times in all are kept, the rest pooled into one column."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(spec) | set(plain), key=lambda k: -(spec[k] + plain[k]))
    common = [k for k in keys if spec[k] + plain[k] >= min_count]
    rows = [[spec[k] for k in common] + [n - sum(spec[k] for k in common)],
            [plain[k] for k in common] + [n - sum(plain[k] for k in common)]]
    cols = [c for c in zip(*rows, strict=True) if sum(c) > 0]
    assert len(cols) >= 3, f"too few outcomes to compare: {keys[:5]}"
    return float(chi2_contingency([list(r) for r in zip(*cols, strict=True)]).pvalue)
