"""What every `vflnet bench` benchmark shares: `--smoke` (tiny sizes, seconds) and `--json` (its figures
as rows, which `vflnet bench all` gathers into one JSON and one Markdown table per benchmark)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

Row = dict[str, str | int | float | bool | None]


def parse_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, smoke: dict[str, Any]
) -> argparse.Namespace:
    """Add --smoke and --json to `parser` and parse `argv`. --smoke puts the `smoke` values in place of
    the defaults: an option given with another value on the command line keeps it."""
    sizes = ", ".join(f"--{k.replace('_', '-')} {_flag_value(v)}" for k, v in smoke.items())
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, seconds: {sizes}")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here, as rows (JSON)")
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in smoke.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    return args


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def write_json(path: Path | None, rows: list[Row], **extra: Any) -> None:
    """The benchmark's figures: one row per measured setting, plus any notes (`extra`)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, **extra}, indent=2) + "\n")


def markdown_table(rows: list[Row]) -> str:
    """The rows as a Markdown table, columns in first-seen order; floats to 4 significant digits."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)
