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


def _generate(sub: argparse._SubParsersAction) -> None:
    from .core.cli_generate import add_generate_parser

    add_generate_parser(sub)


def _make_random_drafter(sub: argparse._SubParsersAction) -> None:
    from .core.random_drafter import add_random_drafter_parser

    add_random_drafter_parser(sub)


SUBCOMMANDS = [_models]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-sglang", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
