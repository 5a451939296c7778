"""`vflnet attacks`: what `vflnet.registry.ATTACKS` holds."""

from __future__ import annotations

import argparse

from vflnet.registry import ATTACKS, describe


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="vflnet attacks", description="list the registered attacks and their parameters"
    )


def main(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    print(describe(ATTACKS))
    return 0
