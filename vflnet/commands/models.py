"""`vflnet models`: what `vflnet.registry.MODELS` holds."""

from __future__ import annotations

import argparse

from vflnet.registry import MODELS, describe


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="vflnet models",
        description="list the registered model kinds (`kind:` of a bottom or top model block)",
    )


def main(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    print(describe(MODELS))
    return 0
