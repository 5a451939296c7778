"""`vflnet run`: a local cluster, one process per party, from a config (or a resumed run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vflnet.commands.arguments import add_overrides, add_start_argument, parse_with_overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet run",
        description="run a local cluster (one process per party) from a config; prints a progress bar, "
        "then a summary table, and writes runs/<run-id>/ (its config.yaml is the resolved config, "
        "overrides included)",
    )
    parser.add_argument("config", type=Path, nargs="?", help="the run config (not with --resume)")
    add_overrides(parser)
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue an interrupted run from its newest checkpoint (its config.yaml, same directory)",
    )
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="run directory (default: <run.dir>/<run.id>)"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (VFLNET_QUIET=1 does the same)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="limit on the whole run: past it every process is stopped and the exit code is 124",
    )
    add_start_argument(parser)
    return parser


def main(argv: list[str]) -> int:
    args = parse_with_overrides(build_parser(), argv)
    from vflnet.runner.local import resume_local, run_local  # after parsing: `--help` needs no torch

    if (args.config is None) == (args.resume is None):
        print("vflnet run: give a config, or --resume RUN_DIR (not both)", file=sys.stderr)
        return 2
    if args.resume is not None:
        if args.overrides:
            print("vflnet run --resume: a resumed run keeps its config (no KEY=VALUE)", file=sys.stderr)
            return 2
        return resume_local(
            args.resume, progress=not args.no_progress, timeout_s=args.timeout, start=args.start
        )
    return run_local(
        args.config,
        run_dir=args.run_dir,
        progress=not args.no_progress,
        timeout_s=args.timeout,
        overrides=args.overrides,
        start=args.start,
    )
