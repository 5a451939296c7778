"""`vflnet datasets`: what `vflnet.registry.DATASETS` holds."""

from __future__ import annotations

import argparse

from vflnet.registry import DATASETS, describe


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="vflnet datasets", description="list the registered datasets (no downloads) and their parameters"
    )


def main(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    print(describe(DATASETS))
    return 0
