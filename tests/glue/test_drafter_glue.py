"""SGLang's model class for the drafter runs the core drafter's layer loop: on a block it gives the core
``DFlashDrafter.forward_block`` output, through the ``dflash_torch`` backend and a paged KV pool."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from transformers import LlamaConfig, PretrainedConfig

from dflash_sglang.core.drafter import ContextKV
from dflash_sglang.core.random_drafter import drafter_config_for, random_drafter
from dflash_sglang.glue.sglang_drafter import DFlashDraftModel
from dflash_sglang.platform.attention import DFlashTorchAttnBackend

SLOTS, MAX_CTX = 256, 64


class Pool:
    """Per-layer paged K/V buffers, the surface inject_context and the backend use."""

    def __init__(self, layers: int, kvh: int, d: int) -> None:
        self.k = [torch.zeros(SLOTS, kvh, d) for _ in range(layers)]
        self.v = [torch.zeros(SLOTS, kvh, d) for _ in range(layers)]

    def set_kv_buffer(self, layer, loc, k, v) -> None:
        self.k[layer.layer_id][loc.loc] = k.view(-1, *self.k[0].shape[1:])
        self.v[layer.layer_id][loc.loc] = v.view(-1, *self.v[0].shape[1:])

    def get_key_buffer(self, i: int) -> torch.Tensor:
        return self.k[i]

    def get_value_buffer(self, i: int) -> torch.Tensor:
        return self.v[i]


@pytest.mark.parametrize("ctx_lens", [[5], [3, 11]])
def test_sglang_drafter_equals_core_drafter_on_a_block(ctx_lens: list[int]) -> None:
    torch.manual_seed(0)
    target = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2)
    cfg = drafter_config_for(target, num_layers=2, block_size=4, mask_token_id=0, num_taps=2)
    core = random_drafter(cfg, 0, std=0.3).float().eval()
    glue = DFlashDraftModel(PretrainedConfig(**cfg.to_dict()))
    glue.load_weights(core.state_dict().items())
    pool = Pool(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    bs, nb = len(ctx_lens), cfg.block_size
    free = torch.randperm(SLOTS - 1) + 1  # scattered slots; 0 stays the padding slot
    req_to_token = torch.zeros(bs + 1, MAX_CTX, dtype=torch.int32)
    taps = [torch.randn(n, cfg.num_taps * cfg.hidden_size) for n in ctx_lens]
    out_locs, embeds, positions = [], [], []
    for b, n in enumerate(ctx_lens):
        slots, free = free[: n + nb], free[n + nb:]
        req_to_token[b + 1, : n + nb] = slots.to(torch.int32)
        glue.inject_context(taps[b], torch.arange(n), slots[:n], pool)  # the worker's prefill injection
        out_locs.append(slots[n:])
        embeds.append(torch.randn(nb, cfg.hidden_size))
        positions.append(torch.arange(n, n + nb))
    fb = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, req_pool_indices=torch.arange(1, bs + 1),
        seq_lens=torch.tensor(ctx_lens), extend_prefix_lens=torch.tensor(ctx_lens),
        extend_seq_lens=torch.full((bs,), nb), out_cache_loc=torch.cat(out_locs).long(),
        positions=torch.cat(positions), spec_info=SimpleNamespace(custom_mask=None), encoder_lens=None,
        padded_static_len=-1, num_token_non_padded=None, moe_num_token_non_padded=None)
    runner = SimpleNamespace(device=torch.device("cpu"), token_to_kv_pool=pool,
                             req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
    backend = DFlashTorchAttnBackend(runner)
    backend.init_forward_metadata(fb)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        got = glue(torch.zeros(bs * nb, dtype=torch.long), fb.positions, fb,
                   input_embeds=torch.cat(embeds)).hidden_states.view(bs, nb, -1)
    for b, n in enumerate(ctx_lens):
        k, v = core.context_kv(taps[b][None], torch.arange(n)[None])
        want = core.forward_block(embeds[b][None], positions[b][None],
                                  ContextKV(k, v, torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool)))
        torch.testing.assert_close(got[b], want[0], rtol=1e-5, atol=1e-5)
    # negative control: a block that ignored its context would differ
    with torch.no_grad():
        alone = core.forward_block(embeds[0][None], positions[0][None], ContextKV(
            [x[:, :0] for x in k], [x[:, :0] for x in v], torch.zeros(1, 0, dtype=torch.long),
            torch.zeros(1, 0, dtype=torch.bool)))
    assert not torch.allclose(got[0], alone[0], atol=1e-3)
