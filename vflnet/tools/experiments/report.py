"""`vflnet report DIR`: a run's or a sweep's report, as Markdown and one self-contained HTML page.

A run directory (it has summary.json): the summary table of `vflnet run`, the run config, loss and
accuracy curves, bytes on the wire per message type, step times, attack scores and the images
attacks saved (CAFE's real-vs-recovered grid, label confusion matrices). A sweep directory (`vflnet
sweep --out`, or a folder of sweep run directories such as a Kubernetes results volume): the results
table, utility-vs-leakage trade-off curves, VFLAIR's defense capability score per setting
(`vflnet.tools.experiments.capability`), every run's curves and wall times, the attacks' images.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflnet.runner.report import read_metrics, summary_rows
from vflnet.tools.experiments import capability, figures
from vflnet.tools.experiments.document import Block, Code, Figure, Heading, Table, Text, not_drawn, write
from vflnet.tools.experiments.results import (
    RUN_META,
    columns,
    read_json,
    result_row,
    setting_label,
    sweep_run_dirs,
)


@dataclass
class RunData:
    dir: Path
    name: str
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    config_text: str
    scores: dict[str, dict[str, Any]]
    images: list[Path]  # PNGs an attack saved in attacks/


@dataclass
class SweepData:
    dir: Path
    name: str
    keys: list[str]  # the varied keys, in the sweep file's order
    rows: list[dict[str, Any]]
    runs: list[RunData]


def is_run_dir(path: Path) -> bool:
    return (path / "summary.json").exists()


def load_run(run_dir: Path) -> RunData:
    summary = read_json(run_dir / "summary.json")
    scores_path = run_dir / "attacks" / "scores.json"
    config = run_dir / "config.yaml"
    return RunData(
        dir=run_dir,
        name=summary.get("run_id") or run_dir.name,
        summary=summary,
        records=read_metrics(run_dir),
        config_text=config.read_text() if config.exists() else "",
        scores=read_json(scores_path) if scores_path.exists() else {},
        images=sorted((run_dir / "attacks").glob("*.png")),
    )


def load_sweep_dir(path: Path) -> SweepData:
    """A `vflnet sweep --out` folder (runs under runs/) or a folder of sweep run directories."""
    runs_dir = path / "runs" if (path / "runs").is_dir() else path
    dirs = sweep_run_dirs(runs_dir)
    if (path / "sweep.json").exists():  # the plan's runs only, as in its results table
        planned = {r["run"] for r in read_json(path / "sweep.json")["runs"]}
        dirs = [d for d in dirs if d.name in planned]
    if not dirs:
        raise FileNotFoundError(
            f"{path}: neither a run directory (summary.json) nor a sweep with completed runs"
        )
    metas = [read_json(d / RUN_META) for d in dirs]
    keys = list(dict.fromkeys(k for m in metas for k in m["params"]))
    return SweepData(
        dir=path,
        name=metas[0].get("sweep") or path.name,
        keys=keys,
        rows=[result_row(d) for d in dirs],
        runs=[load_run(d) for d in dirs],
    )


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return "" if value is None else str(value)


def results_table(rows: list[dict[str, Any]]) -> list[Block]:
    """The results table, folded: a column with one value in every row (two rows or more) is listed
    once above it instead; the run column always stays."""
    names = columns(rows)
    constant = [
        k for k in names if k != "run" and len(rows) > 1 and len({fmt(row.get(k)) for row in rows}) == 1
    ]
    kept = [k for k in names if k not in constant]
    table = Table(kept, [[fmt(row.get(k)) for k in kept] for row in rows])
    if not constant:
        return [table]
    same = "; ".join(f"{k} = {fmt(rows[0].get(k))}" for k in constant)
    return [Text(f"The same in every run: {same}."), table]


def bytes_per_step(records: list[dict[str, Any]], field: str = "bytes_sent") -> dict[str, float]:
    """Mean bytes per training step of each message type, from metrics.jsonl's step records."""
    steps = [r for r in records if r["kind"] == "step"]
    totals: dict[str, float] = {}
    for s in steps:
        for key, n in s.get(field, {}).items():
            totals[key] = totals.get(key, 0) + n
    return {k: v / len(steps) for k, v in sorted(totals.items())}


def timing_rows(run: RunData) -> list[list[str]]:
    times = sorted(r["step_time_s"] * 1000 for r in run.records if r["kind"] == "step")
    rows = [["wall time (s)", fmt(run.summary.get("wall_time_s"))]]
    if times:
        rows += [
            ["steps", str(len(times))],
            ["mean step (ms)", fmt(statistics.fmean(times))],
            ["median step (ms)", fmt(statistics.median(times))],
            ["p95 step (ms)", fmt(times[min(len(times) - 1, int(0.95 * len(times)))])],
            ["slowest step (ms)", fmt(times[-1])],
        ]
    return rows


def score_rows(scores: dict[str, dict[str, Any]]) -> list[list[str]]:
    return [[attack, k, fmt(v)] for attack, metrics in scores.items() for k, v in metrics.items()]


def image_blocks(run: RunData, prefix: str, label: str = "") -> list[Block]:
    """The images an attack saved; captioned with ``label`` (a sweep run's settings), else the run."""
    return [
        Figure(f"{prefix}{run.name}-{p.stem}", p.read_bytes(), f"{label or run.name}: attacks/{p.name}")
        for p in run.images
    ]


def run_blocks(run: RunData, prefix: str = "") -> list[Block]:
    """A run's report; ``prefix`` keeps figure names unique when two runs share a document."""
    blocks: list[Block] = [
        Heading("Summary"),
        Table(["", ""], [list(r) for r in summary_rows(run.dir)]),
        Heading("Run config"),
        Code(run.config_text, folded="config.yaml (click to show)"),
    ]
    if any(r["kind"] == "step" for r in run.records):
        sent, payload = bytes_per_step(run.records), bytes_per_step(run.records, "payload_bytes")
        blocks += [
            Heading("Loss and accuracy"),
            Figure(f"{prefix}curves", figures.training_curves({run.name: run.records}), "loss and accuracy"),
            Heading("Bytes on the wire"),
            Table(
                ["message type (sender/method)", "bytes per step", "tensor payload per step", "total bytes"],
                [
                    [k, fmt(v), fmt(payload.get(k, 0)), fmt(run.summary.get("bytes_sent", {}).get(k))]
                    for k, v in sent.items()
                ],
            ),
            Figure(f"{prefix}bytes", figures.bytes_per_type({run.name: sent}), "bytes per message type"),
            Heading("Timing"),
            Table(["", ""], timing_rows(run)),
            Figure(f"{prefix}step-times", figures.step_times({run.name: run.records}), "step time"),
        ]
    if run.scores or run.images:
        blocks += [Heading("Attacks"), Table(["attack", "metric", "value"], score_rows(run.scores))]
        blocks += image_blocks(run, prefix)
    return blocks


def utility_column(rows: list[dict[str, Any]]) -> str:
    return "test_accuracy" if any("test_accuracy" in r for r in rows) else "train_accuracy"


def leakage_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The attack scores to plot against utility: the real-valued ones that vary across the runs
    (all real-valued ones when none varies), at most four."""
    real = [
        c for c in columns(rows) if c.startswith("attack.") and any(isinstance(r.get(c), float) for r in rows)
    ]
    varying = [c for c in real if len({r.get(c) for r in rows}) > 1]
    return (varying or real)[:4]


def run_labels(sweep: SweepData) -> list[str]:
    """Each run's settings and seed (``scale=0.1, seed=0``), in the order of its runs, for its curves and
    images instead of its run id."""
    return [setting_label(row, [*sweep.keys, "seed"]) for row in sweep.rows]


def named_records(sweep: SweepData) -> dict[str, list[dict[str, Any]]]:
    return {label: run.records for label, run in zip(run_labels(sweep), sweep.runs, strict=True)}


def sweep_blocks(sweep: SweepData, prefix: str = "") -> list[Block]:
    utility, leakage = utility_column(sweep.rows), leakage_columns(sweep.rows)
    blocks: list[Block] = [
        Text(
            f"{len(sweep.rows)} completed runs in {sweep.dir}; varied: {', '.join(sweep.keys) or 'seed only'}."
        ),
        Heading("Results"),
        *results_table(sweep.rows),
    ]
    if leakage:
        blocks += [
            Heading("Trade-off: utility vs leakage"),
            Text(
                f"Mean over seeds (bars: one standard deviation) of {utility} against each attack score; "
                "points are labelled with the first varied key, one curve per setting of the others."
            ),
            Figure(
                f"{prefix}tradeoff",
                figures.tradeoff({sweep.name: sweep.rows}, sweep.keys, utility, leakage),
                "utility vs leakage",
            ),
        ]
    header, scores = capability.score_table(sweep.rows, sweep.keys, utility)
    if scores and len(header) > 3:
        blocks += [
            Heading("Defense capability score"),
            Text(
                "VFLAIR's DCS (Zou et al., ICLR 2024, Eq. 1): 1 / (1 + sqrt((1 - beta) AP^2 + beta (1 - MP)^2)), "
                f"beta = {capability.BETA}, the distance of (AP, MP) from the ideal defense (AP 0, MP 1); "
                "AP: the attack's accuracy-type score, MP: the main-task accuracy, each the mean over seeds."
            ),
            Table(header, [[fmt(v) for v in line] for line in scores]),
        ]
    blocks += [
        Heading("Loss and accuracy"),
        Figure(f"{prefix}curves", figures.training_curves(named_records(sweep)), "every run"),
        Heading("Timing"),
        Figure(
            f"{prefix}run-times",
            figures.run_times({sweep.name: (sweep.keys, sweep.rows)}),
            "wall time per run",
        ),
    ]
    images = [
        b
        for run, label in zip(sweep.runs, run_labels(sweep), strict=True)
        for b in image_blocks(run, prefix, label)
    ]
    if images:
        blocks += [Heading("Attack images"), *images]
    return blocks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet report",
        description="write report.md and a self-contained report.html for a run or a sweep directory",
    )
    parser.add_argument(
        "dir", type=Path, help="a run directory, or a sweep's --out folder (or a results volume)"
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: DIR/report)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        if is_run_dir(args.dir):
            run = load_run(args.dir)
            title, blocks = f"vflnet run {run.name}", run_blocks(run)
        else:
            sweep = load_sweep_dir(args.dir)
            title, blocks = f"vflnet sweep {sweep.name}", sweep_blocks(sweep)
    except (FileNotFoundError, NotADirectoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md, page = write(args.out or args.dir / "report", title, blocks)
    print(f"{md}\n{page}")
    for why in not_drawn(blocks):
        print(f"figures left out: {why}", file=sys.stderr)
    return 0
