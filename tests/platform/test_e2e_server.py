"""End to end: a real SGLang server on the dflash CPU platform serves SmolLM2-135M greedy-identically
to HF transformers, under concurrency, with radix-cache hits, with NGRAM speculative decoding
(TARGET_VERIFY with tree masks), and from an SGLang frontend program.

One plain server per module (started by the first test that needs it); the NGRAM server is started
and stopped inside its own test. All requests use greedy decoding, ``ignore_eos`` and 32 new tokens.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from server_fixture import ServerClient, default_model_path

pytestmark = pytest.mark.slow

MAX_NEW = 32
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List the planets of the solar system in order:",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Explain what a hash table is in one sentence.",
    "Translate to French: I like apples.",
]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}],
    [{"role": "user", "content": "Give me a synonym for happy."}],
    [{"role": "user", "content": "Repeat after me: red green blue red green blue"}],
    [{"role": "user", "content": "What is the boiling point of water?"}],
    [{"role": "user", "content": "Write one line of Python that prints hi."}],
    [{"role": "user", "content": "Count from one to five."}],
]


# ---------------------------------------------------------------------------------------------
# HF transformers reference
# ---------------------------------------------------------------------------------------------


class HFGreedy:
    """fp32 HF model + tokenizer; ``continuation(ids)`` = 32 greedy ids, ignoring EOS (cached)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)  # the server shares the CPU; oversubscribed OpenMP crawls
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self._cache: dict[tuple[int, ...], list[int]] = {}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    @torch.inference_mode()
    def continuation(self, ids: list[int]) -> list[int]:
        key = tuple(ids)
        if key not in self._cache:
            out, past = [], None
            step = torch.tensor([ids])
            for _ in range(MAX_NEW):
                result = self.model(input_ids=step, past_key_values=past, use_cache=True)
                past = result.past_key_values
                token = int(result.logits[0, -1].argmax())
                out.append(token)
                step = torch.tensor([[token]])
            self._cache[key] = out
        return self._cache[key]


@pytest.fixture(scope="module")
def hf() -> HFGreedy:
    return HFGreedy(default_model_path())


@pytest.fixture(scope="module")
def server(sglang_server: Any) -> Iterator[ServerClient]:
    yield sglang_server.start()


def _gen(srv: ServerClient, ids: list[int]) -> dict[str, Any]:
    return srv.generate(input_ids=ids, max_new_tokens=MAX_NEW, ignore_eos=True)


# ---------------------------------------------------------------------------------------------
# plain server
# ---------------------------------------------------------------------------------------------


def test_generate_matches_hf_greedy(server: ServerClient, hf: HFGreedy) -> None:
    for prompt in PROMPTS:
        ids = hf.encode(prompt)
        out = _gen(server, ids)
        assert out["output_ids"] == hf.continuation(ids), prompt
        assert out["meta_info"]["completion_tokens"] == MAX_NEW


def test_chat_completions_match_hf_greedy(server: ServerClient, hf: HFGreedy) -> None:
    for messages in CHATS:
        out = server.chat(
            messages,
            max_tokens=MAX_NEW,
            ignore_eos=True,
            return_input_ids_in_sglext=True,
            return_output_ids_in_sglext=True,
        )
        prompt_ids = out["sglext"]["input_ids"]
        text = hf.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert list(prompt_ids) == hf.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert out["sglext"]["output_ids"][0] == hf.continuation(list(prompt_ids)), messages


def test_eight_concurrent_requests(server: ServerClient, hf: HFGreedy) -> None:
    ids = [hf.encode(p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        outs = list(pool.map(lambda x: _gen(server, x), ids))
    for prompt_ids, out in zip(ids, outs, strict=True):
        assert out["output_ids"] == hf.continuation(prompt_ids)


def test_radix_cache_prefix_hit(server: ServerClient) -> None:
    # A prefix no earlier request shares (nonce first), ~300 tokens long.
    prefix = f"[{uuid.uuid4().hex}] " + " ".join(
        f"Item {i} is a {'red' if i % 2 else 'blue'} box." for i in range(40)
    )
    text = prefix + " Question: what colour is item 7? Answer:"
    first = server.generate(text, max_new_tokens=MAX_NEW)
    second = server.generate(text, max_new_tokens=MAX_NEW)
    assert second["meta_info"]["cached_tokens"] > 200
    assert second["meta_info"]["cached_tokens"] > first["meta_info"]["cached_tokens"]
    assert second["output_ids"] == first["output_ids"]


def test_frontend_program(server: ServerClient) -> None:
    import sglang as sgl

    @sgl.function
    def capital(s: Any, country: str) -> None:
        s += f"The capital of {country} is"
        s += sgl.gen("answer", max_tokens=16, temperature=0.0)

    backend = sgl.RuntimeEndpoint(server.base_url)
    state = capital.run(country="France", backend=backend)
    direct = server.generate("The capital of France is", max_new_tokens=16)
    assert state["answer"] == direct["text"]
    assert "Paris" in state["answer"]


# ---------------------------------------------------------------------------------------------
# NGRAM speculative decoding: lossless against the plain (HF-equal) greedy outputs
# ---------------------------------------------------------------------------------------------

NGRAM_ARGS = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]


def test_ngram_speculative_is_lossless(sglang_server: Any, hf: HFGreedy) -> None:
    ids = [hf.encode(p) for p in PROMPTS]
    with sglang_server(NGRAM_ARGS) as spec:
        outs = [_gen(spec, x) for x in ids]
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            concurrent_outs = list(pool.map(lambda x: _gen(spec, x), ids[:4]))
    verify_steps = 0
    for prompt_ids, out in zip(ids, outs, strict=True):
        assert out["output_ids"] == hf.continuation(prompt_ids)
        verify_steps += out["meta_info"]["spec_verify_ct"]
    for prompt_ids, out in zip(ids[:4], concurrent_outs, strict=True):
        assert out["output_ids"] == hf.continuation(prompt_ids)
    # Drafts were accepted: fewer verify forwards than generated tokens (after the prefill token).
    assert verify_steps < len(ids) * (MAX_NEW - 1)
