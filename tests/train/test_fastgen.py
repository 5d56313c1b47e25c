"""The continuous-batching distill engine gives HF's greedy answers and tap features, slot reuse included."""

from __future__ import annotations

import pytest
import torch

from dflash_sglang.core.target import HFTarget
from dflash_sglang.train.data import GenSettings, answer_batch
from dflash_sglang.train.fastgen import SlotGenerator, supports

from .tiny import EOS, VOCAB, tiny_model, tiny_prompts


def _qwen3_model() -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=EOS, initializer_range=0.3)
    return Qwen3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("make", [tiny_model, _qwen3_model], ids=["llama", "qwen3"])
@pytest.mark.parametrize("slots", [1, 3, 16])
def test_slot_engine_equals_hf_greedy_with_taps(make, slots: int) -> None:
    torch.set_num_threads(1)
    model = make()
    taps = (0, 2)
    prompts = tiny_prompts(7, seed=3)
    free = answer_batch(HFTarget(model, taps), prompts, GenSettings(12, 8, (), taps, False))
    eos = int(free[0].ids[free[0].prompt_len + 3])  # some answers end early, on this "EOS"
    ref = answer_batch(HFTarget(model, taps), prompts, GenSettings(12, 8, (eos,), taps, True))
    gen = SlotGenerator(model, slots, max_len=32, max_new_tokens=12, eos_token_ids=(eos,), tap_layer_ids=taps)
    got = {f.index: f for f in gen.run(list(enumerate(prompts)))}
    assert sorted(got) == list(range(7))  # slots < prompts: slots are reused as answers end
    for i, r in enumerate(ref):
        assert got[i].ids == r.ids.tolist() and got[i].prompt_len == r.prompt_len
        torch.testing.assert_close(got[i].taps.float(), r.taps.float(), atol=2e-2, rtol=2e-2)
    lengths = [len(r.ids) - r.prompt_len for r in ref]
    assert min(lengths) < 12 and max(lengths) == 12  # answers ended on EOS and at max_new_tokens


def test_slot_engine_refuses_what_it_cannot_run() -> None:
    model = tiny_model()
    gen = SlotGenerator(model, 2, max_len=16, max_new_tokens=10, eos_token_ids=(EOS,))
    with pytest.raises(ValueError, match="exceed max_len"):
        list(gen.run([(0, list(range(2, 12)))]))
    model.model.rotary_emb = None
    del model.model.rotary_emb
    assert "rotary_emb" in (supports(model) or "")


def test_stop_on_loop_cuts_each_answer_where_a_window_first_repeats() -> None:
    """Answers with stop_on_loop are the full greedy answers cut right after the first token that
    completes a W-token window already in the answer; answers that never loop are untouched."""
    torch.set_num_threads(1)
    model = tiny_model()
    prompts = tiny_prompts(8, seed=5)
    todo = list(enumerate(prompts))
    full = {f.index: f for f in SlotGenerator(model, 4, 96, 60, ()).run(todo)}
    cut = {f.index: f for f in SlotGenerator(model, 4, 96, 60, (), stop_on_loop=3).run(todo)}
    shortened = 0
    for i, f in full.items():
        ans = f.ids[f.prompt_len:]
        want = len(ans)
        seen: set = set()
        for j in range(1, len(ans)):  # the window ending at answer token j (j >= 2 for W = 3)
            if j >= 2:
                w = tuple(ans[j - 2: j + 1])
                if w in seen:
                    want = j + 1
                    break
                seen.add(w)
        assert cut[i].ids == f.ids[: f.prompt_len + want], i
        shortened += want < len(ans)
    assert shortened > 0  # the tiny random target does loop
