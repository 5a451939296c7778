"""`vflnet run`: a local cluster, one process per party, from a config (or a resumed run)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

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
        help="limit on the whole command, counted from its start (start-up included): past it every "
        "process is stopped and the exit code is 124",
    )
    add_start_argument(parser)
    return parser


def early_fork_server(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """The run's fork server, started before this launcher imports torch and checks the config, so
    that the server's imports (~4-6 s on 2 cores) overlap the launcher's (~2.5 s) instead of following
    them. Only the schema is read here (vflnet.config imports no torch); a config that fails it, a
    loopback run or a cold start get no early server, and the launcher goes on as without one (its
    own checks report the config's errors). The launcher uses the server as it uses a sweep's
    (`vflnet.runner.warm.shared_server`), when its torch threads match."""
    from vflnet.config import ConfigError, parse, read_yaml
    from vflnet.overrides import apply_overrides, parse_overrides
    from vflnet.runner.warm import offered_fork_server, shared_server

    if args.start != "warm" or shared_server() is not None:
        return contextlib.nullcontext()
    path = args.config if args.config is not None else args.resume / "config.yaml"
    try:
        cfg = parse(apply_overrides(read_yaml(path), parse_overrides(args.overrides)), str(path))
    except (ConfigError, OSError, TypeError, ValueError):
        return contextlib.nullcontext()
    if cfg.transport.bridge == "loopback":
        return contextlib.nullcontext()
    return offered_fork_server(cfg.runtime.torch_threads)


def main(argv: list[str]) -> int:
    args = parse_with_overrides(build_parser(), argv)
    if (args.config is None) == (args.resume is None):
        print("vflnet run: give a config, or --resume RUN_DIR (not both)", file=sys.stderr)
        return 2
    with early_fork_server(args):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from vflnet.runner.local import (
        process_started,
        resume_local,
        run_local,
    )  # after parsing: no torch for --help

    since = process_started()  # --timeout counts from the command's start, its imports included
    if args.resume is not None:
        if args.overrides:
            print("vflnet run --resume: a resumed run keeps its config (no KEY=VALUE)", file=sys.stderr)
            return 2
        return resume_local(
            args.resume, progress=not args.no_progress, timeout_s=args.timeout, start=args.start, since=since
        )
    return run_local(
        args.config,
        run_dir=args.run_dir,
        progress=not args.no_progress,
        timeout_s=args.timeout,
        overrides=args.overrides,
        start=args.start,
        since=since,
    )
