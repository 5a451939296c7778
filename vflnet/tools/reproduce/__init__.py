"""`vflnet reproduce NAME`: paper reproductions from real runs; docs/reproduction.md collects their tables."""

from __future__ import annotations

import argparse


def add_size_flags(parser: argparse.ArgumentParser, quick: str, smoke: str) -> None:
    """--quick and --smoke, exclusive: every experiment's reduced sizes (`vflnet reproduce` passes them on)."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument("--smoke", action="store_true", help=f"tiny sizes, under a minute: {smoke}")
