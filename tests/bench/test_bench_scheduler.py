"""--scheduler: which SGLang loop each benchmarked server runs."""

from __future__ import annotations

from dflash_sglang.bench.cli import with_scheduler
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
