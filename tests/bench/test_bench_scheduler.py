"""--scheduler and --tp: the SGLang loop, and the tensor-parallel size, of each benchmarked server."""

from __future__ import annotations

from dflash_sglang.bench.cli import with_scheduler, with_tp
from dflash_sglang.bench.runner import method_specs
from dflash_sglang.bench.server import BASE_SERVER_ARGS, OVERLAP_OFF


def test_overlap_is_the_default_loop_and_both_adds_a_no_overlap_twin() -> None:
    assert OVERLAP_OFF not in BASE_SERVER_ARGS  # SGLang's default loop, as users run it
    specs = method_specs(("nospec", "dflash"), "/d", 16, 8)
    assert with_scheduler(specs, "overlap") == specs
    both = with_scheduler(specs, "both")
    assert [s.name for s in both] == ["nospec", "nospec-no-overlap", "dflash", "dflash-no-overlap"]
    assert [OVERLAP_OFF in s.extra_args for s in both] == [False, True, False, True]
    assert both[3].extra_args[:-1] == specs[1].extra_args and both[3].env == specs[1].env
    off = with_scheduler(specs, "no-overlap")
    assert [s.name for s in off] == ["nospec", "dflash"] and all(s.extra_args[-1] == OVERLAP_OFF for s in off)


def test_tp_sizes_above_one_rerun_every_method_with_tp_size() -> None:
    specs = method_specs(("nospec", "dflash"), "/d", 16, 8)
    assert with_tp(specs, (1,)) == specs
    both = with_tp(specs, (1, 2))
    assert [s.name for s in both] == ["nospec", "dflash", "nospec-tp2", "dflash-tp2"]
    assert both[:2] == specs
    assert [s.extra_args[-2:] for s in both[2:]] == [("--tp-size", "2")] * 2
    assert both[3].extra_args[:-2] == specs[1].extra_args and both[3].env == specs[1].env


def test_common_server_args_carry_the_dtype_and_the_running_cap() -> None:
    from dflash_sglang.bench.cli import BASE_MAX_RUNNING, common_server_args

    assert common_server_args([1, 8], "float32") == ()  # BASE_SERVER_ARGS hold --dtype float32
    assert common_server_args([1, 8], "bfloat16") == ("--dtype", "bfloat16")
    big = BASE_MAX_RUNNING + 4
    want = ("--max-running-requests", str(big), "--dtype", "bfloat16")
    assert common_server_args([1, big], "bfloat16") == want
