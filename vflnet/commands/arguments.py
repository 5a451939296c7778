"""Arguments that several commands share: config overrides and how a run's processes start."""

from __future__ import annotations

import argparse
import os


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """``KEY=VALUE ...``: config overrides (read them with :func:`parse_with_overrides`)."""
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="set a config key (dotted; a list index as .N or [N], from 0) to a YAML value, e.g. "
        "train.epochs=3 parties.2.bottom.hidden=[32] (docs/config.md)",
    )


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, where KEY=VALUE overrides may also follow an option: argparse takes
    one run of positionals only."""
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "overrides", None) is not None and not any(a.startswith("-") for a in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def add_start_argument(parser: argparse.ArgumentParser) -> None:
    """``--start``: how a run's role processes start (vflnet/runner/warm.py)."""
    parser.add_argument(
        "--start",
        choices=("warm", "cold"),
        default=os.environ.get("VFLNET_START") or "warm",
        help="warm: forked from one interpreter that has torch and vflnet imported (a fork server); "
        "cold: each a new `python -m vflnet party` (default: $VFLNET_START, else warm)",
    )
