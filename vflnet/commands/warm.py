"""`vflnet warm`: this installation's resident fork server (vflnet/runner/resident.py)."""

from __future__ import annotations

import argparse
import sys
import time

from vflnet.runner import resident
from vflnet.subcommands import add_action, run_action

START_TIMEOUT_S = 300.0  # its imports take ~3-6 s on 2 quiet cores; far more on a loaded machine
STOP_TIMEOUT_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    from vflnet.config import RuntimeConfig

    parser = argparse.ArgumentParser(
        prog="vflnet warm",
        description="A resident fork server: an interpreter with torch and vflnet imported that outlives "
        "this command. While it runs, every `vflnet` command of this installation (same interpreter, "
        "same source files, same import-time environment) runs as a fork of it, and so do a run's role "
        "processes: no command waits for torch's imports. It stops after --idle-minutes without a "
        "command, or on `vflnet warm stop`. VFLNET_RESIDENT=off makes a command ignore it.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    start = add_action(sub, "start", _start, "start it (or report the one running) and wait for its imports")
    start.add_argument(
        "--torch-threads",
        type=int,
        default=RuntimeConfig().torch_threads,
        help="runtime.torch_threads of the runs whose role processes it starts (a run that asks for "
        "another number starts them from a fork server of its own) (default %(default)s)",
    )
    start.add_argument(
        "--idle-minutes",
        type=float,
        default=resident.DEFAULT_IDLE_MINUTES,
        help="it ends after this long without a command (default %(default)s)",
    )
    add_action(sub, "stop", _stop, "stop it (a command still running in it is stopped too)")
    add_action(
        sub, "status", _status, "whether it runs, its pid, socket and settings (exit 1 when it does not)"
    )
    return parser


def main(argv: list[str]) -> int:
    return run_action(build_parser().parse_args(argv))


def _start(args: argparse.Namespace) -> int:
    if args.torch_threads < 1:
        print(f"vflnet warm start: --torch-threads must be >= 1, not {args.torch_threads}", file=sys.stderr)
        return 2
    if args.idle_minutes <= 0:
        print(f"vflnet warm start: --idle-minutes must be > 0, not {args.idle_minutes:g}", file=sys.stderr)
        return 2
    began = time.monotonic()
    files, pid, started = resident.start(args.torch_threads, args.idle_minutes, START_TIMEOUT_S)
    if started:
        print(
            f"resident fork server {pid} ready in {time.monotonic() - began:.1f} s at {files.socket}; "
            f"it ends after {args.idle_minutes:g} min idle or on `vflnet warm stop`"
        )
    else:
        print(f"resident fork server {pid} already running at {files.socket}")
    return 0


def _status(args: argparse.Namespace) -> int:
    found = resident.running_server()
    if found is None:
        print("no resident fork server runs for this installation")
        return 1
    files, info = found
    age_min = (time.time() - float(info["started"])) / 60  # type: ignore[arg-type]
    print(
        f"resident fork server {info['pid']} at {files.socket}: torch_threads {info['torch_threads']}, "
        f"ends after {info['idle_minutes']} min idle, started {age_min:.1f} min ago"
    )
    return 0


def _stop(args: argparse.Namespace) -> int:
    found = resident.running_server()
    if found is None:
        print("no resident fork server runs for this installation")
        return 0
    _, info = found
    resident.stop_pid(int(info["pid"]), STOP_TIMEOUT_S)  # type: ignore[call-overload]
    print(f"resident fork server {info['pid']} stopped")
    return 0
