"""`vflnet defenses`: what `vflnet.registry.DEFENSES` holds."""

from __future__ import annotations

import argparse

from vflnet.registry import DEFENSES, describe


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="vflnet defenses", description="list the registered defenses and their parameters"
    )


def main(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    print(describe(DEFENSES))
    return 0
