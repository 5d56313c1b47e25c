"""DFLASH under data parallelism on the CPU platform: ``--dp 2`` starts two schedulers, each with its own
target and our worker; SGLang's data-parallel controller spreads requests over them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from dflash_sglang.bench.runner import dflash_args
from dflash_sglang.bench.server import launch_sglang_server

pytestmark = pytest.mark.slow
NEW = 48


def greedy_outputs(args: list[str], prompts: list[list[int]], env: dict | None = None) -> tuple[list, str]:
    with launch_sglang_server(args, env=env) as srv:
        with ThreadPoolExecutor(3) as pool:  # concurrent, so both DP ranks get requests
            outs = list(pool.map(lambda ids: srv.generate(input_ids=ids, max_new_tokens=NEW)["output_ids"],
                                 prompts))
        return outs, srv.log_path.read_text(errors="replace")


def test_dp2_both_ranks_run_our_worker_and_greedy_equals_nospec(prompt_ids, drafter_path) -> None:
    prompts = prompt_ids[:6]
    want, _ = greedy_outputs(["--dp", "2"], prompts)
    got, log = greedy_outputs(["--dp", "2", *dflash_args(str(drafter_path), 16)], prompts,
                              env={"DFLASH_SGLANG_ADAPTIVE": "off"})
    assert log.count("dflash-sglang: our DFlash worker runs") == 2, "one worker per DP rank"
    assert got == want
