"""`vflnet compare A B`: two runs or two sweeps side by side, as Markdown and one HTML page.

Two runs: their summary tables in one table, the config keys that differ, loss/accuracy, bytes per
message type and step times drawn on shared axes, then each run's report side by side. Two sweeps:
their trade-off curves and run times on shared axes, then each sweep's report side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from vflnet.runner.report import summary_rows
from vflnet.tools.experiments import figures
from vflnet.tools.experiments.document import Block, Columns, Figure, Heading, Table, Text, not_drawn, write
from vflnet.tools.experiments.report import (
    RunData,
    SweepData,
    bytes_per_step,
    is_run_dir,
    leakage_columns,
    load_run,
    load_sweep_dir,
    run_blocks,
    sweep_blocks,
    utility_column,
)


def labels(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a != b else (f"A: {a}", f"B: {b}")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{dotted key: value}`` (lists indexed ``[i]``), to list the keys that differ."""
    if isinstance(data, dict):
        return {
            k: v
            for key, value in data.items()
            for k, v in flatten(value, f"{prefix}.{key}".lstrip(".")).items()
        }
    if isinstance(data, list) and any(isinstance(v, dict | list) for v in data):
        return {k: v for i, value in enumerate(data) for k, v in flatten(value, f"{prefix}[{i}]").items()}
    return {prefix: data}


def compare_runs(a: RunData, b: RunData) -> list[Block]:
    la, lb = labels(a.name, b.name)
    rows_a, rows_b = dict(summary_rows(a.dir)), dict(summary_rows(b.dir))
    keys = list(dict.fromkeys([*rows_a, *rows_b]))
    config_a, config_b = (
        flatten(yaml.safe_load(a.config_text) or {}),
        flatten(yaml.safe_load(b.config_text) or {}),
    )
    differ = [
        k
        for k in dict.fromkeys([*config_a, *config_b])
        if config_a.get(k) != config_b.get(k) and k != "run.id"
    ]
    return [
        Heading("Summary"),
        Table(["", la, lb], [[k, rows_a.get(k, ""), rows_b.get(k, "")] for k in keys]),
        Heading("Config keys that differ"),
        Table(["key", la, lb], [[k, str(config_a.get(k, "")), str(config_b.get(k, ""))] for k in differ])
        if differ
        else Text("The configs are the same (apart from run.id)."),
        Heading("Loss and accuracy"),
        Figure("curves", figures.training_curves({la: a.records, lb: b.records}), "loss and accuracy"),
        Heading("Bytes on the wire"),
        Figure(
            "bytes",
            figures.bytes_per_type({la: bytes_per_step(a.records), lb: bytes_per_step(b.records)}),
            "bytes per message type",
        ),
        Heading("Timing"),
        Figure("step-times", figures.step_times({la: a.records, lb: b.records}), "step time"),
        Columns((la, lb), run_blocks(a, "a-"), run_blocks(b, "b-")),
    ]


def compare_sweeps(a: SweepData, b: SweepData) -> list[Block]:
    la, lb = labels(a.name, b.name)
    blocks: list[Block] = []
    leakage = [c for c in leakage_columns(a.rows) if c in leakage_columns(b.rows)]
    if leakage and a.keys[:1] == b.keys[:1]:  # one x-label per panel: the first varied key must agree
        utility = utility_column(a.rows + b.rows)
        blocks += [
            Heading("Trade-off: utility vs leakage"),
            Figure(
                "tradeoff",
                figures.tradeoff({la: a.rows, lb: b.rows}, a.keys, utility, leakage),
                "both sweeps",
            ),
        ]
    blocks += [
        Heading("Timing"),
        Figure(
            "run-times", figures.run_times({la: (a.keys, a.rows), lb: (b.keys, b.rows)}), "wall time per run"
        ),
        Columns((la, lb), sweep_blocks(a, "a-"), sweep_blocks(b, "b-")),
    ]
    return blocks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet compare",
        description="put two runs or two sweeps side by side (compare.md, compare.html)",
    )
    parser.add_argument("a", type=Path, help="a run directory or a sweep folder")
    parser.add_argument("b", type=Path, help="another of the same kind")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: ./compare-A-vs-B)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if is_run_dir(args.a) != is_run_dir(args.b):
        print("error: compare two runs or two sweeps, not one of each", file=sys.stderr)
        return 2
    try:
        if is_run_dir(args.a):
            a, b = load_run(args.a), load_run(args.b)
            title, blocks = f"vflnet compare: run {a.name} vs {b.name}", compare_runs(a, b)
        else:
            sa, sb = load_sweep_dir(args.a), load_sweep_dir(args.b)
            title, blocks = f"vflnet compare: sweep {sa.name} vs {sb.name}", compare_sweeps(sa, sb)
    except (FileNotFoundError, NotADirectoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(f"compare-{args.a.resolve().name}-vs-{args.b.resolve().name}")
    md, page = write(out, title, blocks, stem="compare")
    print(f"wrote {md} and {page}")
    for why in not_drawn(blocks):
        print(f"figures left out: {why}", file=sys.stderr)
    return 0
