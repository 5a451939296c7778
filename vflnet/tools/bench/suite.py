"""`vflnet bench [all]`: every benchmark in turn, their figures in one JSON and one Markdown file.

Each benchmark's own report (its tables and notes) goes to OUT/<name>.log; OUT/bench.json holds every
benchmark's rows and wall time, OUT/bench.md the same as Markdown tables. `--smoke` runs each at tiny
sizes (seconds each): a check that every benchmark runs, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from vflnet import progress
from vflnet.tools.bench import BENCHMARKS
from vflnet.tools.bench.common import markdown_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vflnet bench all", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="every benchmark at tiny sizes (about a minute)")
    p.add_argument("--out", type=Path, default=Path("runs/bench"), help="output folder")
    p.add_argument(
        "--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS), help="default: all"
    )
    return p


def run_one(name: str, out: Path, smoke: bool) -> dict[str, Any]:
    """Run one benchmark, its output to OUT/<name>.log; its figures and wall time (or the error)."""
    figures = out / f"{name}.json"
    argv = ["--json", str(figures)] + (["--smoke"] if smoke else [])
    if name == "feature-reconstruction":
        argv += ["--plot", str(out / "feature-reconstruction.png")]
    start = time.perf_counter()
    with (out / f"{name}.log").open("w") as log, contextlib.redirect_stdout(log):
        try:
            rc = BENCHMARKS[name].run(argv)
            error = None if rc == 0 else f"exit code {rc}"
        except Exception:  # one broken benchmark must not hide the others' figures
            error = traceback.format_exc()
            print(error)
    result: dict[str, Any] = {"seconds": time.perf_counter() - start}
    if error is not None:
        return {**result, "error": error}
    return {**result, **json.loads(figures.read_text())}


def markdown(results: dict[str, dict[str, Any]], smoke: bool) -> str:
    lines = [
        f"# vflnet bench{' --smoke' if smoke else ''}",
        "",
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end."
        + (" Smoke sizes: a check that every benchmark runs, not a measurement." if smoke else ""),
    ]
    for name, r in results.items():
        lines += ["", f"## {name} ({r['seconds']:.0f} s)", ""]
        if "error" in r:
            lines.append(f"failed:\n\n```\n{r['error']}\n```")
            continue
        lines.append(markdown_table(r["rows"]))
        notes = {k: v for k, v in r.items() if k not in ("rows", "seconds")}
        if notes:
            lines += ["", "; ".join(f"{k}: {v}" for k, v in notes.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    with progress.runs("vflnet bench", total=len(args.only), unit="benchmark"):
        for name in args.only:
            results[name] = r = run_one(name, out, args.smoke)
            status = "FAILED" if "error" in r else "done"
            print(f"{name}: {status} in {r['seconds']:.0f} s (report: {out / f'{name}.log'})", flush=True)
            progress.advance(name)
    record = {"smoke": args.smoke, "cores": os.cpu_count(), "benchmarks": results}
    (out / "bench.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "bench.md").write_text(markdown(results, args.smoke))
    print(f"figures: {out / 'bench.json'}, tables: {out / 'bench.md'}")
    failed = [name for name, r in results.items() if "error" in r]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
