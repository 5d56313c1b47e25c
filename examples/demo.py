"""`make demo`: the product on this machine. SGLang serves SmolLM2-135M-Instruct with our DFLASH worker and
the shipped drafter; a no-spec server answers the same prompts in the same run for comparison.

Prints each answer, then tau (tokens committed per verify step), tokens/s of both servers, the speedup,
and whether DFLASH's greedy output is token for token the no-spec server's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dflash_sglang.bench.runner import dflash_args
from dflash_sglang.bench.server import ServerClient, launch_sglang_server
from dflash_sglang.models import fetch_model
from dflash_sglang.prompts import chat_ids, first_per_category, load_prompts

DRAFTER = Path(__file__).resolve().parents[1] / "drafters" / "smollm2-135m-dflash-b16"


def answer_all(srv: ServerClient, prompts: list[list[int]], new: int) -> tuple[list[dict], float]:
    """One request at a time (concurrency 1); -> responses, output tokens per second."""
    srv.generate(input_ids=prompts[0], max_new_tokens=8)  # warm-up
    started, out = time.perf_counter(), []
    for ids in prompts:
        out.append(srv.generate(input_ids=ids, max_new_tokens=new))
    tokens = sum(r["meta_info"]["completion_tokens"] for r in out)
    return out, tokens / (time.perf_counter() - started)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True, help="prompts JSONL (Spec-Bench first turns)")
    ap.add_argument("--per-category", type=int, default=1, help="prompts per category")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    target = fetch_model("smollm2-135m", log=lambda m: print(m, file=sys.stderr))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    picked = first_per_category(load_prompts(args.prompts), args.per_category)[: args.limit]
    prompts = [chat_ids(tok, p.text) for p in picked]
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, one request at a time\n")
    with launch_sglang_server([]) as plain:
        want, plain_tps = answer_all(plain, prompts, args.max_new_tokens)
    with launch_sglang_server(list(dflash_args(str(DRAFTER)))) as spec:
        got, spec_tps = answer_all(spec, prompts, args.max_new_tokens)
    for p, r in zip(picked, got, strict=True):
        m = r["meta_info"]
        print(f"--- [{p.category}] {p.text[:70]!r}\n{r['text'].strip()}\n"
              f"    (tau {m['completion_tokens'] / max(1, m['spec_verify_ct']):.2f})\n")
    tokens = sum(r["meta_info"]["completion_tokens"] for r in got)
    steps = sum(r["meta_info"]["spec_verify_ct"] for r in got)
    same = all(g["output_ids"] == w["output_ids"] for g, w in zip(got, want, strict=True))
    print(f"tau {tokens / max(1, steps):.2f} | DFLASH {spec_tps:.1f} tok/s | no-spec {plain_tps:.1f} tok/s | "
          f"speedup {spec_tps / plain_tps:.2f}x | output identical to no-spec: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
