"""End to end: `python -m sglang.launch_server --speculative-algorithm DFLASH` runs OUR worker.

Real SGLang servers on the CPU platform, talked to over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
NEW = 64
# A leaked KV slot crashes the server; the adaptive block policy is off, so every decode step verifies the
# block asked for (the fixed-block path, the GPU default). One test below runs the policy.
STRICT = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", "DFLASH_SGLANG_ADAPTIVE": "off"}


def dflash_args(drafter: Path, block: int) -> list[str]:
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter),
            "--speculative-num-draft-tokens", str(block)]


def greedy(srv, prompts: list[list[int]], concurrency: int, new: int = NEW) -> list[dict]:
    def one(ids: list[int]) -> dict:
        return srv.generate(input_ids=ids, max_new_tokens=new, temperature=0.0)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


@pytest.fixture(scope="module")
def reference(sglang_server, prompt_ids) -> list[list[int]]:
    """The no-spec server's greedy token ids, one request at a time."""
    with sglang_server([]) as srv:
        return [r["output_ids"] for r in greedy(srv, prompt_ids, 1)]


@pytest.fixture(scope="module")
def dflash16(sglang_server, drafter_path):
    return sglang_server.start(dflash_args(drafter_path, 16), env=STRICT)


def assert_same(got: list[dict], want: list[list[int]], what: str) -> None:
    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g["output_ids"] != w]
    assert not bad, f"{what}: prompts {bad} differ from the no-spec server"


def test_our_worker_is_the_one_running(dflash16) -> None:
    log = dflash16.log_path.read_text(errors="replace")
    assert "dflash-sglang: our DFlash worker runs (block 16" in log


@pytest.mark.parametrize("block", [4, 8, 16])
def test_greedy_identical_to_nospec(sglang_server, dflash16, drafter_path, prompt_ids, reference, block):
    if block == 16:
        srv_ctx = None
        srv = dflash16
    else:
        srv_ctx = sglang_server(dflash_args(drafter_path, block), env=STRICT)
        srv = srv_ctx.__enter__()
    try:
        assert f"our DFlash worker runs (block {block}" in srv.log_path.read_text(errors="replace")
        # Ragged batches (concurrency 8) on all 16 prompts; one request at a time on the first 4 (at
        # block 16 the tau test below covers 8 prompts one at a time). A fixed block on 2 cores decodes
        # at 3-5 tok/s, so every prompt-pass here costs minutes of CI.
        for conc, n in ((8, len(prompt_ids)), (1, 0 if block == 16 else 4)):
            got = greedy(srv, prompt_ids[:n], conc)
            assert_same(got, reference[:n], f"block {block}, concurrency {conc}")
            assert all(g["meta_info"]["spec_verify_ct"] > 0 for g in got)
    finally:
        if srv_ctx is not None:
            srv_ctx.__exit__(None, None, None)


def test_greedy_identical_with_the_adaptive_policy(sglang_server, drafter_path, prompt_ids, reference):
    """The CPU default: the policy switches block sizes between steps; output stays the no-spec one."""
    env = {**STRICT, "DFLASH_SGLANG_ADAPTIVE": "on"}
    with sglang_server(dflash_args(drafter_path, 16), env=env) as srv:
        assert "adaptive block on" in srv.log_path.read_text(errors="replace")
        for conc, n in ((8, len(prompt_ids)), (1, 8)):
            assert_same(greedy(srv, prompt_ids[:n], conc), reference[:n], f"adaptive, concurrency {conc}")


def test_server_tau_equals_the_reference_engine(dflash16, drafter_path, target_path, prompt_ids, reference):
    """At a fixed block the server drafts and verifies exactly like the reference engine: same output,
    same acceptance (committed tokens per verify step) within 2%. A server that drafted from stale or
    missing context would still be lossless, but its tau would fall below the engine's."""
    import torch

    from dflash_sglang.core.drafter import DFlashDrafter
    from dflash_sglang.core.engine import EngineConfig, ReferenceEngine
    from dflash_sglang.core.sampling import SamplingConfig
    from dflash_sglang.core.target import HFTarget, load_hf_target
    from dflash_sglang.prompts import eos_token_ids

    prompts = prompt_ids[:8]
    got = greedy(dflash16, prompts, 1)
    server_tau = sum(g["meta_info"]["completion_tokens"] - 1 for g in got) / sum(
        g["meta_info"]["spec_verify_ct"] for g in got)
    torch.set_num_threads(1)
    model, tok = load_hf_target(str(target_path))
    drafter = DFlashDrafter.from_pretrained(drafter_path)
    engine = ReferenceEngine(HFTarget(model, drafter.cfg.target_layer_ids), drafter,
                             EngineConfig(16, NEW, eos_token_ids(model, tok)))
    runs = [engine.generate([p], SamplingConfig.uniform(1))[0] for p in prompts]
    assert [r.output_ids for r in runs] == reference[:8]
    engine_tau = sum(len(r.output_ids) - 1 for r in runs) / sum(r.steps for r in runs)
    assert engine_tau > 1.05, f"the drafter accepts almost nothing (engine tau {engine_tau:.3f})"
    assert abs(server_tau - engine_tau) <= 0.02 * engine_tau, (server_tau, engine_tau)


def injected_lines(srv) -> list[tuple[int, int]]:
    out = []
    for line in srv.log_path.read_text(errors="replace").splitlines():
        if "prefill injected" in line:
            words = line.split("prefill injected ")[1].split()
            out.append((int(words[0]), int(words[3].lstrip("("))))
    return out


def test_radix_prefix_hit_reuses_target_and_draft_kv(dflash16, prompt_ids, reference) -> None:
    long_prefix = prompt_ids[3] * 3  # a long prompt nobody sent before
    first = dflash16.generate(input_ids=long_prefix, max_new_tokens=32)
    before = len(injected_lines(dflash16))
    second = dflash16.generate(input_ids=long_prefix, max_new_tokens=32)
    assert second["output_ids"] == first["output_ids"]
    cached = second["meta_info"]["cached_tokens"]
    assert cached >= len(long_prefix) - 1
    lines = injected_lines(dflash16)[before:]
    assert lines, "no prefill log line for the second request"
    injected, reused = lines[-1]
    # Only the uncached tail was projected into the draft KV: the cached part was reused.
    assert injected == len(long_prefix) - cached and reused == cached


def test_aborts_under_load_leak_no_kv(dflash16, prompt_ids) -> None:
    rids = [f"abort-{i}-{random.random()}" for i in range(6)]
    errors: list[Exception] = []

    def run(i: int) -> None:
        try:
            dflash16.generate(input_ids=prompt_ids[i], max_new_tokens=160, ignore_eos=True, rid=rids[i])
        except Exception as e:  # noqa: BLE001 - aborted requests may answer with an error
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    dflash16.wait_for(lambda: dflash16.in_flight() >= 6, "the six requests to be in flight")
    import urllib.request

    for rid in rids[:4]:
        body = json.dumps({"rid": rid}).encode()
        req = urllib.request.Request(f"{dflash16.base_url}/abort_request", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
    for t in threads:
        t.join(timeout=600)
    dflash16.wait_idle()  # idle iterations: the scheduler's strict leak check runs
    assert dflash16.process.poll() is None, "server died (KV leak check?)"
    assert "memory leak" not in dflash16.log_path.read_text(errors="replace")
    ok = dflash16.generate(input_ids=prompt_ids[0], max_new_tokens=8)
    assert len(ok["output_ids"]) == 8


def test_sampling_distribution_matches_nospec(sglang_server, dflash16) -> None:
    from collections import Counter

    from parity import same_distribution_pvalue

    prompt = "<|im_start|>user\nSay one word.<|im_end|>\n<|im_start|>assistant\n"
    n = 240

    def samples(srv) -> Counter:
        def one(i: int) -> tuple[int, ...]:
            r = srv.generate(text=prompt, max_new_tokens=2, temperature=0.7, sampling_seed=i)
            return tuple(r["output_ids"][:2])

        with ThreadPoolExecutor(8) as pool:
            return Counter(pool.map(one, range(n)))

    spec = samples(dflash16)
    with sglang_server([]) as plain_srv:
        plain = samples(plain_srv)
    p = same_distribution_pvalue(spec, plain, n)
    assert p > 1e-3, f"DFLASH sampling distribution differs from no-spec (p={p:.2e})"


def test_frontend_program(dflash16) -> None:
    code = f"""
import sglang as sgl
sgl.set_default_backend(sgl.RuntimeEndpoint("{dflash16.base_url}"))

@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=24, temperature=0))

state = qa.run(question="What is the capital of France?")
print("ANSWER:", state["answer"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ANSWER:" in out.stdout and "Paris" in out.stdout


@pytest.mark.parametrize("change,message", [
    ({"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
      "head_dim": 32}, "hidden_size: drafter has 64, target has 576"),
    ({"num_target_layers": 48, "dflash_config": {"target_layer_ids": [1, 40], "mask_token_id": 0}},
     "target_layer_ids=[1, 40]: the target has only 30 layers"),
])
def test_mismatched_drafter_refused_with_one_line(sglang_server, target_path, tmp_path, change, message):
    from transformers import AutoConfig

    from dflash_sglang.core.config import DFlashConfig
    from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter

    base = drafter_config_for(AutoConfig.from_pretrained(str(target_path)), block_size=16).to_dict()
    base.update(change)
    random_drafter(DFlashConfig.from_dict(base)).save_pretrained(tmp_path / "bad")
    with pytest.raises(RuntimeError) as err, sglang_server(dflash_args(tmp_path / "bad", 16),
                                                           startup_timeout_s=400):
        pass
    assert message in str(err.value)
