"""Acceptance under structured output: tau with and without grammar-masked drafting, same prompts.

Starts a DFLASH server twice (``DFLASH_SGLANG_GRAMMAR_DRAFT=on``, then ``off``; adaptive block off,
so every step verifies the full block) and sends every case of ``dflash_sglang.bench.grammar_cases``
(JSON schema, regex, EBNF; greedy) one at a time through ``/generate``. tau = committed tokens per
verify step, summed over the requests; the JSON also has per-kind tau and tokens/s.

    python benchmarks/grammar_tau.py --drafter drafters/smollm2-135m-dflash-b16 \
        --out benchmarks/results/smollm2-135m-cpu/grammar_tau.json
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from dflash_sglang.bench.grammar_cases import CHAT, EBNF_CASES, JSON_CASES, REGEX_CASES
from dflash_sglang.bench.machine import describe_machine
from dflash_sglang.bench.server import launch_sglang_server


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def cases() -> list[tuple[str, str, str]]:
    """(kind, prompt, grammar) for every case; JSON schemas as the strings SGLang takes."""
    out = [("json_schema", p, json.dumps(s)) for p, s in JSON_CASES]
    out += [("regex", p, g) for p, g in REGEX_CASES]
    return out + [("ebnf", p, g) for p, g, _ in EBNF_CASES]


def run(drafter: str, masked: bool, new: int, block: int | None) -> dict[str, Any]:
    env = {"DFLASH_SGLANG_ADAPTIVE": "off", "DFLASH_SGLANG_GRAMMAR_DRAFT": "on" if masked else "off"}
    args = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter]
    if block:
        args += ["--speculative-num-draft-tokens", str(block)]
    per_kind: dict[str, list[int]] = {}
    outputs = []
    with launch_sglang_server(args, env=env) as srv:
        started = time.perf_counter()
        for kind, prompt, grammar in cases():
            body = {"text": CHAT.format(q=prompt),
                    "sampling_params": {"max_new_tokens": new, "temperature": 0, kind: grammar}}
            meta = post(f"{srv.base_url}/generate", body)["meta_info"]
            tokens, steps = int(meta["completion_tokens"]), int(meta.get("spec_verify_ct", 0))
            acc = per_kind.setdefault(kind, [0, 0])
            acc[0], acc[1] = acc[0] + tokens, acc[1] + steps
            outputs.append({"kind": kind, "tokens": tokens, "verify_steps": steps})
        seconds = time.perf_counter() - started
    tokens = sum(v[0] for v in per_kind.values())
    steps = sum(v[1] for v in per_kind.values())
    return {"grammar_draft": "on" if masked else "off", "requests": len(outputs), "tokens": tokens,
            "verify_steps": steps, "tau": tokens / max(steps, 1), "seconds": seconds,
            "tok_s": tokens / seconds,
            "tau_by_kind": {k: v[0] / max(v[1], 1) for k, v in per_kind.items()}, "per_request": outputs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="drafters/smollm2-135m-dflash-b16")
    p.add_argument("--block-size", type=int, default=0, help="0: the drafter's block size")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    runs = [run(a.drafter, masked, a.max_new_tokens, a.block_size or None) for masked in (True, False)]
    result = {"benchmark": "grammar_tau", "drafter": a.drafter, "block_size": a.block_size or "drafter's",
              "max_new_tokens": a.max_new_tokens, "runs": runs, "machine": describe_machine(),
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for r in runs:
        kinds = {k: round(v, 3) for k, v in r["tau_by_kind"].items()}
        print(f"grammar draft {r['grammar_draft']}: tau {r['tau']:.3f} over {r['verify_steps']} steps, "
              f"{r['tok_s']:.2f} tok/s, by kind {kinds}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
