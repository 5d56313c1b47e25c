"""The drafter's head-sharded attention under tensor parallelism equals its unsharded attention."""

from __future__ import annotations

import pytest
import torch
from tp_threads import run_ranks

from dflash_sglang.core.config import DFlashConfig, DFlashConfigError
from dflash_sglang.core.layers import masked_attention
from dflash_sglang.glue.sglang_drafter import HeadShard, drafter_config


class _Hf:
    def __init__(self, **kw) -> None:  # noqa: ANN003
        self.__dict__.update(kw)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _cfg(heads: int, kv: int) -> DFlashConfig:
    return DFlashConfig.from_dict({
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": 8, "vocab_size": 32, "num_target_layers": 4,
        "block_size": 4, "dflash_config": {"mask_token_id": 0}})


@pytest.mark.parametrize(("heads", "kv", "padded_kv", "tp"), [(9, 3, 4, 2), (8, 2, 2, 2), (8, 2, 2, 4),
                                                              (4, 1, 1, 2), (9, 3, 3, 3)])
def test_sharded_heads_gathered_equal_unsharded_attention(heads: int, kv: int, padded_kv: int,
                                                          tp: int) -> None:
    torch.manual_seed(0)
    cfg = _cfg(heads, kv)
    group = heads // kv
    hf = _Hf(num_attention_heads=padded_kv * group, num_key_value_heads=padded_kv)
    n, nk, d = 5, 11, 8
    q, k, v = torch.randn(1, n, heads, d), torch.randn(1, nk, kv, d), torch.randn(1, nk, kv, d)
    mask = torch.ones(1, 1, n, nk, dtype=torch.bool)
    want = masked_attention(q, k, v, mask, 0.3)[0]  # [n, heads, d]

    def work(rank: int, gather):  # noqa: ANN001, ANN202
        sh = HeadShard.of(cfg, hf, tp, rank)
        ql = sh.local(q, sh.q_heads, sh.q0, sh.local_q)
        kl, vl = (sh.local(t, sh.kv_heads, sh.kv0, sh.local_kv) for t in (k, v))
        assert ql.shape[-2] == sh.local_q and kl.shape[-2] == sh.local_kv
        return sh.gather(masked_attention(ql, kl, vl, mask, 0.3)[0], gather)

    for got in run_ranks(tp, work):
        torch.testing.assert_close(got, want)


def test_heads_that_cannot_be_split_are_refused() -> None:
    with pytest.raises(DFlashConfigError, match="cannot be split"):
        HeadShard.of(_cfg(9, 3), _Hf(num_attention_heads=9, num_key_value_heads=3), 2, 0)


def test_drafter_config_undoes_sglangs_cpu_head_padding() -> None:
    hf = _Hf(**{**_cfg(9, 3).raw, "num_attention_heads": 12, "num_key_value_heads": 4,
                "original_num_attention_heads": 9, "original_total_num_kv_heads": 3})
    cfg = drafter_config(hf)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3)
