"""Structured output under DFLASH: JSON schema, regex and EBNF requests give the no-spec server's output.

Real SGLang servers (xgrammar on the CPU platform): no speculation, and DFLASH at the drafter's block
with the adaptive policy off, so every decode step verifies a full block under the grammar. Greedy
outputs must be token-identical and valid for their grammar; sampled outputs must follow the same
distribution; invalid grammars get the no-spec server's error reply.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from parity import STRICT, client, post, readme_dflash_args, same_distribution_pvalue

from dflash_sglang.bench.grammar_cases import CHAT, EBNF_CASES, JSON_CASES, REGEX_CASES

pytestmark = pytest.mark.slow
NEW = 48


def json_request(srv, prompt: str, schema: dict) -> tuple[str, str]:
    r = client(srv).chat.completions.create(
        model="default", messages=[{"role": "user", "content": prompt}], max_tokens=NEW, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    return r.choices[0].message.content, r.choices[0].finish_reason


def grammar_request(srv, prompt: str, key: str, grammar: str, **sampling: Any) -> dict:
    body = {"text": CHAT.format(q=prompt),
            "sampling_params": {"max_new_tokens": NEW, "temperature": 0, key: grammar, **sampling}}
    status, out = post(srv, "/generate", body)
    assert status == 200, out
    return out


def run_all(srv) -> list[Any]:
    jobs = [lambda p=p, s=s: json_request(srv, p, s) for p, s in JSON_CASES]
    jobs += [lambda p=p, g=g: grammar_request(srv, p, "regex", g) for p, g in REGEX_CASES]
    jobs += [lambda p=p, g=g: grammar_request(srv, p, "ebnf", g) for p, g, _ in EBNF_CASES]
    jobs += [lambda: json_object_request(srv), lambda: plain_request(srv)]
    with ThreadPoolExecutor(4) as pool:  # constrained and unconstrained requests share batches
        return list(pool.map(lambda job: job(), jobs))


def json_object_request(srv) -> tuple[str, str]:
    r = client(srv).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Give a tiny JSON object about a dog."}],
        max_tokens=NEW, temperature=0, response_format={"type": "json_object"})
    return r.choices[0].message.content, r.choices[0].finish_reason


def plain_request(srv) -> dict:
    status, out = post(srv, "/generate", {"text": CHAT.format(q="Tell me about the sea."),
                                          "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    assert status == 200, out
    return out


def comparable(result: Any) -> Any:
    if isinstance(result, tuple):
        return result
    return result["output_ids"], result["meta_info"]["finish_reason"]


def test_constrained_greedy_identical_to_nospec_and_valid(nospec, dflash) -> None:
    want, got = run_all(nospec), run_all(dflash)
    bad = [i for i, (w, g) in enumerate(zip(want, got, strict=True)) if comparable(w) != comparable(g)]
    assert not bad, f"requests {bad} differ from no-spec: {[(want[i], got[i]) for i in bad[:2]]}"
    n_json = len(JSON_CASES)
    for (prompt, schema), (text, finish) in zip(JSON_CASES, got[:n_json], strict=True):
        assert finish == "stop", f"{prompt!r}: did not finish inside {NEW} tokens: {text!r}"
        value = json.loads(text)
        assert set(schema["required"]) <= set(value) <= set(schema["properties"]), text
    patterns = [p for _, p in REGEX_CASES] + [p for _, _, p in EBNF_CASES]
    for pattern, out in zip(patterns, got[n_json:-2], strict=True):
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            assert re.fullmatch(pattern, out["text"]), (pattern, out["text"])
    finished = sum(out["meta_info"]["finish_reason"]["type"] == "stop" for out in got[n_json:-2])
    assert finished >= len(patterns) - 2, "most regex/EBNF outputs should complete their grammar"
    meta = [out["meta_info"] for out in got[n_json:-2]]
    assert sum(m.get("spec_verify_ct", 0) for m in meta) > 0, "DFLASH never verified a block"


def test_free_drafts_verified_under_grammar_identical(sglang_server, nospec, drafter_path) -> None:
    """DFLASH_SGLANG_GRAMMAR_DRAFT=off: drafts ignore the grammar, verification alone enforces it."""
    cases = REGEX_CASES[:4] + [(p, g) for p, g, _ in EBNF_CASES[:2]]
    keys = ["regex"] * 4 + ["ebnf"] * 2
    free = {**STRICT, "DFLASH_SGLANG_GRAMMAR_DRAFT": "off"}
    with sglang_server(readme_dflash_args(drafter_path), env=free) as srv:
        got = [grammar_request(srv, p, k, g)["output_ids"] for (p, g), k in zip(cases, keys, strict=True)]
    want = [grammar_request(nospec, p, k, g)["output_ids"] for (p, g), k in zip(cases, keys, strict=True)]
    assert got == want


def test_constrained_sampling_distribution_matches_nospec(nospec, dflash) -> None:
    from collections import Counter


    regex = r"(red|green|blue|yellow|purple|orange|black|white|pink|brown)( and (red|green|blue|gray))?"
    n = 200

    def samples(srv) -> Counter:
        def one(i: int) -> str:
            out = grammar_request(srv, "Name a color.", "regex", regex, temperature=1.0, sampling_seed=i)
            assert re.fullmatch(regex, out["text"]), out["text"]
            return out["text"]

        with ThreadPoolExecutor(8) as pool:
            return Counter(pool.map(one, range(n)))

    spec, plain = samples(dflash), samples(nospec)
    p = same_distribution_pvalue(spec, plain, n)
    assert p > 1e-3, f"constrained sampling under DFLASH differs from no-spec (p={p:.2e})"


@pytest.mark.parametrize("key,grammar", [
    ("regex", "[0-9"), ("json_schema", '{"type": "object", "properties": '), ("ebnf", "root ::= ("),
])
def test_invalid_grammar_gets_the_nospec_reply(nospec, dflash, key: str, grammar: str) -> None:
    body = {"text": CHAT.format(q="Hi."), "sampling_params": {"max_new_tokens": 8, key: grammar}}
    want, got = post(nospec, "/generate", body), post(dflash, "/generate", body)
    assert got[0] == want[0], (got, want)
    assert json.dumps(got[1]).count("rror") == json.dumps(want[1]).count("rror")
    assert len(dflash.generate(text="Hi.", max_new_tokens=4)["output_ids"]) == 4  # still serving
