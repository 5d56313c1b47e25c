"""Every request the no-spec server handles, DFLASH handles the same way (real servers, real clients).

Two servers side by side: no speculation, and DFLASH started with the README's own command (no
``--speculative-num-draft-tokens``: the block comes from the drafter's config). The adaptive block
policy is off, so every decode step verifies a full block and the per-position logic is exercised.
Requests go through the ``openai`` package and plain HTTP.
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from parity import COMMON, STRICT, client, post, readme_dflash_args, same_distribution_pvalue

pytestmark = pytest.mark.slow
COLORS = [{"role": "user", "content": "List three colors, one per line, numbered."}]
HELLO = "hello hello hello hello hello"


def test_readme_command_starts_with_the_drafters_block(dflash) -> None:
    log = dflash.log_path.read_text(errors="replace")
    assert "dflash-sglang: our DFlash worker runs (block 16" in log
    assert "adaptive block off" in log


# ----------------------------------------------------------------------- sampling parameters
def _disallow_processor() -> str:
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    return DisallowedTokensLogitsProcessor.to_str()


CHAT_CASES = {
    "logit_bias": {"max_tokens": 10, "logit_bias": {"42": 100}},
    "frequency_penalty": {"max_tokens": 40, "frequency_penalty": 1.5},
    "presence_penalty": {"max_tokens": 40, "presence_penalty": 1.5},
    "repetition_penalty": {"max_tokens": 40, "extra_body": {"repetition_penalty": 1.4}},
    "min_tokens": {"max_tokens": 60, "extra_body": {"min_tokens": 50}},
    "min_p": {"max_tokens": 40, "extra_body": {"min_p": 0.3}},
    "stop_token_ids": {"max_tokens": 40, "extra_body": {"stop_token_ids": [28]}},
    "ignore_eos": {"max_tokens": 60, "extra_body": {"ignore_eos": True}},
    "stop": {"max_tokens": 40, "stop": ["Blue"]},
    "penalties_mixed": {"max_tokens": 40, "frequency_penalty": 0.6, "presence_penalty": 0.4,
                        "extra_body": {"repetition_penalty": 1.2, "min_tokens": 20}},
}
COMPLETION_CASES = {
    "frequency_penalty": {"frequency_penalty": 2.0},
    "presence_penalty": {"presence_penalty": 2.0},
    "repetition_penalty": {"extra_body": {"repetition_penalty": 1.6}},
    "logit_bias": {"logit_bias": {"28": 5.0}},
}


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_greedy_parameter_identical(nospec, dflash, case: str) -> None:
    kwargs = CHAT_CASES[case]

    def run(srv) -> str:
        r = client(srv).chat.completions.create(model="default", messages=COLORS, temperature=0, **kwargs)
        return r.choices[0].message.content

    want, got = run(nospec), run(dflash)
    assert got == want, f"{case}: DFLASH {got!r} != no-spec {want!r}"


@pytest.mark.parametrize("case", sorted(COMPLETION_CASES))
def test_completion_greedy_parameter_identical(nospec, dflash, case: str) -> None:
    def run(srv) -> str:
        r = client(srv).completions.create(model="default", prompt=HELLO, temperature=0, max_tokens=40,
                                           **COMPLETION_CASES[case])
        return r.choices[0].text

    want, got = run(nospec), run(dflash)
    assert got == want, f"{case}: DFLASH {got!r} != no-spec {want!r}"


def test_custom_logit_processor_identical(nospec, dflash, prompt_ids) -> None:
    body = {"input_ids": prompt_ids[1], "custom_logit_processor": _disallow_processor(),
            "sampling_params": {"max_new_tokens": 40, "temperature": 0,
                                "custom_params": {"token_ids": [28, 30, 198]}}}
    (s1, want), (s2, got) = post(nospec, "/generate", body), post(dflash, "/generate", body)
    assert s1 == s2 == 200
    assert got["output_ids"] == want["output_ids"]
    assert not {28, 30, 198} & set(got["output_ids"])


def test_penalised_and_plain_requests_in_one_batch(nospec, dflash, prompt_ids) -> None:
    """Concurrent requests, half penalised: every one equals its no-spec answer."""
    bodies = [{"input_ids": ids, "sampling_params": {"max_new_tokens": 32, "temperature": 0,
               **({"frequency_penalty": 1.0, "repetition_penalty": 1.3} if i % 2 else {})}}
              for i, ids in enumerate(prompt_ids[:8])]

    def run(srv) -> list[list[int]]:
        with ThreadPoolExecutor(8) as pool:
            return [r[1]["output_ids"] for r in pool.map(lambda b: post(srv, "/generate", b), bodies)]

    assert run(dflash) == run(nospec)


# ---------------------------------------------------------------------------------- logprobs
def _logprob_body(ids: list[int], **sampling: Any) -> dict[str, Any]:
    return {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 5, "token_ids_logprob": [28, 198],
            "logprob_start_len": max(0, len(ids) - 6),
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, **sampling}}


def _assert_close_logprobs(got: dict, want: dict, tol: float = 1e-4) -> None:
    for key in ("output_token_logprobs", "input_token_logprobs"):
        g, w = got["meta_info"][key], want["meta_info"][key]
        assert [t[1] for t in g] == [t[1] for t in w], f"{key}: token ids differ"
        for (gv, *_), (wv, *_) in zip(g, w, strict=True):
            assert (gv is None and wv is None) or math.isclose(gv, wv, abs_tol=tol), f"{key}: {gv} vs {wv}"
    for key in ("output_top_logprobs", "output_token_ids_logprobs"):
        g, w = got["meta_info"][key], want["meta_info"][key]
        assert len(g) == len(w)
        for grow, wrow in zip(g, w, strict=True):
            assert [t[1] for t in grow] == [t[1] for t in wrow], f"{key}: ids differ"
            for gt, wt in zip(grow, wrow, strict=True):
                assert math.isclose(gt[0], wt[0], abs_tol=tol), f"{key}: {gt} vs {wt}"


def test_generate_logprobs_equal_nospec(nospec, dflash, prompt_ids) -> None:
    for ids in prompt_ids[:3]:
        s1, want = post(nospec, "/generate", _logprob_body(ids))
        s2, got = post(dflash, "/generate", _logprob_body(ids))
        assert s1 == s2 == 200, (s1, s2, got)
        assert got["output_ids"] == want["output_ids"]
        _assert_close_logprobs(got, want)


def test_penalised_logprobs_equal_nospec(nospec, dflash, prompt_ids) -> None:
    body = _logprob_body(prompt_ids[2], frequency_penalty=1.2, logit_bias={"28": 2.0})
    (_, want), (_, got) = post(nospec, "/generate", body), post(dflash, "/generate", body)
    assert got["output_ids"] == want["output_ids"]
    _assert_close_logprobs(got, want)


def test_logprob_and_plain_requests_in_one_batch(nospec, dflash, prompt_ids) -> None:
    bodies = [_logprob_body(ids) if i % 2 else
              {"input_ids": ids, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
              for i, ids in enumerate(prompt_ids[:8])]

    def run(srv) -> list[dict]:
        with ThreadPoolExecutor(8) as pool:
            return [r[1] for r in pool.map(lambda b: post(srv, "/generate", b), bodies)]

    got, want = run(dflash), run(nospec)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["output_ids"] == w["output_ids"]
        if i % 2:
            _assert_close_logprobs(g, w)


def test_sampled_logprobs_are_the_targets(nospec, dflash, prompt_ids) -> None:
    """A sampled request (temperature 1) under DFLASH: each returned logprob equals the no-spec
    server's log-probability of that same token after the same prefix (scored as input)."""
    ids = prompt_ids[4]
    _, got = post(dflash, "/generate", {"input_ids": ids, "return_logprob": True, "sampling_params":
                                        {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 3}})
    out = got["output_ids"]
    _, scored = post(nospec, "/generate", {"input_ids": ids + out, "return_logprob": True,
                                           "logprob_start_len": len(ids) - 1,
                                           "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    want = [t[0] for t in scored["meta_info"]["input_token_logprobs"][1:]][: len(out)]
    have = [t[0] for t in got["meta_info"]["output_token_logprobs"]]
    assert len(have) == len(out) == len(want)
    for h, w in zip(have, want, strict=True):
        assert math.isclose(h, w, abs_tol=1e-4), (h, w)


def test_openai_chat_logprobs_equal_nospec(nospec, dflash) -> None:
    def run(srv):
        r = client(srv).chat.completions.create(model="default", messages=COLORS, temperature=0,
                                                max_tokens=20, logprobs=True, top_logprobs=3)
        return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for t in r.choices[0].logprobs.content]

    got, want = run(dflash), run(nospec)
    assert [g[0] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want, strict=True):
        assert math.isclose(g[1], w[1], abs_tol=1e-4)
        assert [a[0] for a in g[2]] == [a[0] for a in w[2]]


def test_openai_completion_logprobs_equal_nospec(nospec, dflash) -> None:
    def run(srv):
        r = client(srv).completions.create(model="default", prompt="The capital of France is", temperature=0,
                                           max_tokens=16, logprobs=2)
        return r.choices[0].logprobs.tokens, r.choices[0].logprobs.token_logprobs

    (gt, gl), (wt, wl) = run(dflash), run(nospec)
    assert gt == wt
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(gl, wl, strict=True))


def test_logprobs_at_an_explicit_block_size(sglang_server, nospec, drafter_path, prompt_ids) -> None:
    args = COMMON + readme_dflash_args(drafter_path) + ["--speculative-num-draft-tokens", "8"]
    with sglang_server(args, env=STRICT) as srv:
        assert "our DFlash worker runs (block 8" in srv.log_path.read_text(errors="replace")
        (_, want), (_, got) = post(nospec, "/generate", _logprob_body(prompt_ids[5])), \
            post(srv, "/generate", _logprob_body(prompt_ids[5]))
        assert got["output_ids"] == want["output_ids"]
        _assert_close_logprobs(got, want)


# ------------------------------------------------------------------------------ openai client
def test_openai_client_features_identical(nospec, dflash) -> None:
    """Streaming, n > 1 (greedy, so every choice is the same), stop sequences and seed."""
    def run(srv) -> dict:
        c = client(srv)
        stream = c.chat.completions.create(model="default", messages=COLORS, temperature=0, max_tokens=30,
                                           stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        multi = c.completions.create(model="default", prompt="Once upon a time", temperature=0,
                                     max_tokens=20, n=2)
        stop = c.chat.completions.create(model="default", messages=COLORS, temperature=0, max_tokens=40,
                                         stop=["3."])
        seeded = c.chat.completions.create(model="default", messages=COLORS, temperature=0.8, max_tokens=20,
                                           seed=11)
        return {"streamed": streamed, "n": [ch.text for ch in multi.choices],
                "stop": (stop.choices[0].message.content, stop.choices[0].finish_reason),
                "seeded_ok": bool(seeded.choices[0].message.content)}

    got, want = run(dflash), run(nospec)
    assert got["streamed"] == want["streamed"]
    assert got["n"] == want["n"] and len(got["n"]) == 2
    assert got["stop"] == want["stop"]
    assert got["seeded_ok"] and want["seeded_ok"]


# ---------------------------------------------------------------------------- hostile input
HOSTILE = {
    "empty_text": {"text": "", "sampling_params": {"max_new_tokens": 4}},
    "empty_ids": {"input_ids": [], "sampling_params": {"max_new_tokens": 4}},
    "id_too_large": {"input_ids": [1, 2, 49152], "sampling_params": {"max_new_tokens": 4}},
    "negative_id": {"input_ids": [1, -5, 3], "sampling_params": {"max_new_tokens": 4}},
    "over_long": {"input_ids": [28] * 9000, "sampling_params": {"max_new_tokens": 4}},
    "max_new_tokens_0": {"text": "Hi", "sampling_params": {"max_new_tokens": 0}},
    "max_new_tokens_huge": {"text": "Hi", "sampling_params": {"max_new_tokens": 10**9}},
    "negative_temperature": {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "temperature": -1}},
    "top_k_zero": {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0.5, "top_k": 0}},
    "top_k_negative": {"text": "Hi",
                       "sampling_params": {"max_new_tokens": 4, "temperature": 0.5, "top_k": -7}},
    "top_k_huge": {"text": "Hi",
                   "sampling_params": {"max_new_tokens": 4, "temperature": 0.5, "top_k": 10**7}},
    "top_p_zero": {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0.5, "top_p": 0}},
    "invalid_utf8": b'{"text": "\xff\xfe bad", "sampling_params": {"max_new_tokens": 4}}',
    "not_json": b"{nope",
}


def _outcome(status: int, body: Any) -> tuple[int, str]:
    """Status and, for errors, the message (ignoring fields that differ per request)."""
    if status == 200:
        return status, ""
    msg = body.get("error", {}).get("message", body) if isinstance(body, dict) else body
    return status, str(msg)[:200]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_handled_like_nospec(nospec, dflash, case: str) -> None:
    want = _outcome(*post(nospec, "/generate", HOSTILE[case]))
    got = _outcome(*post(dflash, "/generate", HOSTILE[case]))
    assert got == want, f"{case}: DFLASH {got} != no-spec {want}"
    for srv in (nospec, dflash):
        assert srv.process.poll() is None, f"{case} took a server down"
        assert post(srv, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})[0] == 200


@pytest.mark.parametrize("case", ["empty_text", "empty_ids", "id_too_large", "negative_id"])
def test_inputs_that_crash_sglang_get_400(dflash, case: str) -> None:
    status, body = post(dflash, "/generate", HOSTILE[case])
    assert status == 400, (status, body)
    # SGLang itself refuses empty input_ids ("input_ids cannot be empty."); our guard covers the rest
    assert any(m in str(body) for m in ("prompt is empty", "outside the vocabulary", "cannot be empty")), body


# ------------------------------------------------------------------------- sglang.bench_serving
def bench_serving(srv, target_path: Path, out: Path) -> dict:
    """SGLang's own serving benchmark on its random-ids dataset with the local tokenizer (no download)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", srv.base_url,
           "--model", str(target_path), "--tokenizer", str(target_path), "--dataset-name", "random-ids",
           "--num-prompts", "16", "--random-input-len", "128", "--random-output-len", "32",
           "--random-range-ratio", "0.5", "--max-concurrency", "4", "--warmup-requests", "1",
           "--disable-tqdm", "--seed", "1", "--output-file", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    result = json.loads(out.read_text().strip().splitlines()[-1])
    name = "dflash" if "DFLASH" in srv.args else "nospec"
    print(f"bench_serving {name}: completed {result['completed']}, output tok/s "
          f"{result['output_throughput']:.2f}, median TPOT {result.get('median_tpot_ms', 0):.1f} ms, "
          f"accept length {result.get('accept_length')}")
    return result


def test_sglang_bench_serving_runs_against_both(nospec, dflash, target_path, tmp_path) -> None:
    plain = bench_serving(nospec, target_path, tmp_path / "nospec.jsonl")
    spec = bench_serving(dflash, target_path, tmp_path / "dflash.jsonl")
    assert plain["completed"] == spec["completed"] == 16
    assert spec["total_output_tokens"] > 0


# ------------------------------------------------------------------------ sampled, penalised
def test_sampled_penalised_distribution_matches_nospec(nospec, dflash) -> None:
    """Temperature 0.8 with a strong frequency penalty on a prompt that invites repetition: the joint
    distribution of the first three tokens is the no-spec server's (chi-squared, as in the plain test)."""
    from collections import Counter


    prompt = "<|im_start|>user\nSay yes yes yes yes.<|im_end|>\n<|im_start|>assistant\n"
    n = 240

    def samples(srv) -> Counter:
        def one(i: int) -> tuple[int, ...]:
            _, r = post(srv, "/generate", {"text": prompt, "sampling_params": {
                "max_new_tokens": 3, "temperature": 0.8, "frequency_penalty": 2.0, "sampling_seed": i}})
            return tuple(r["output_ids"][:3])

        with ThreadPoolExecutor(8) as pool:
            return Counter(pool.map(one, range(n)))

    spec, plain = samples(dflash), samples(nospec)
    p = same_distribution_pvalue(spec, plain, n)
    assert p > 1e-3, f"DFLASH penalised sampling differs from no-spec (p={p:.2e})"
