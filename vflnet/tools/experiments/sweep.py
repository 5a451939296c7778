"""`vflnet sweep`: run every run a sweep file declares, a few at a time, resumable; one results table.

Layout of ``--out DIR``::

    DIR/sweep.json              the plan: sweep name, varied keys, every run's name, seed and values
    DIR/configs/<run>.yaml      each run's config; <run>.json its sweep-run.json
    DIR/runs/<run>/             each run's directory (what `vflnet run` writes, plus sweep-run.json)
    DIR/logs/<run>.log          each run's console output
    DIR/results.csv, .json      the table (vflnet.tools.experiments.results)

Each run is its own `vflnet sweep one` process (`vflnet run` inside: real gRPC processes, or the
loopback bridge where the run config says so). It runs into ``<run>.partial/`` and renames that to
``<run>/`` only once the run completed, so a directory under ``runs/`` named after a run is always a
finished run: a killed sweep, started again, skips those and redoes the rest. Kubernetes Jobs run the
same `vflnet sweep one` (vflnet.tools.experiments.k8s).

With ``--start warm`` (the default) the sweep starts one fork server (vflnet/runner/warm.py): every
`vflnet sweep one` is forked from it, and so are the role processes of every run, so no run pays for
starting an interpreter or importing torch. A run whose ``runtime.torch_threads`` (an import-time
setting) differs from the first run's starts its role processes from a fork server of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from vflnet import progress
from vflnet.commands.arguments import add_start_argument
from vflnet.config import ConfigError, RuntimeConfig
from vflnet.runner.interrupt import INTERRUPTED_EXIT, interruptible, signal_of
from vflnet.runner.warm import ForkServer, Process, fork_server, shared_server, start_vflnet
from vflnet.tools.experiments.results import (
    PARTIAL,
    RUN_META,
    collect,
    complete,
    is_completed,
    write_atomic,
    write_table,
)

if TYPE_CHECKING:  # vflnet.tools.experiments.plan imports torch: imported where used, not for `--help`
    from vflnet.tools.experiments.plan import PlannedRun, Sweep


def write_run_files(sweep: Sweep, run: PlannedRun, configs_dir: Path) -> tuple[Path, Path]:
    """A run's config and sweep-run.json, as `vflnet sweep one` takes them."""
    from vflnet.tools.experiments.plan import run_meta

    config_path, meta_path = configs_dir / f"{run.name}.yaml", configs_dir / f"{run.name}.json"
    write_atomic(config_path, yaml.safe_dump(run.config, sort_keys=False))
    write_atomic(meta_path, json.dumps(run_meta(sweep, run), indent=2))
    return config_path, meta_path


def run_one(config_path: Path, meta_path: Path, dest: Path, start: str = "warm") -> int:
    """Run one config into ``dest`` unless it is already there; ``dest`` appears only when complete."""
    from vflnet.runner.local import run_local

    if is_completed(dest):
        return 0
    partial = dest.with_name(dest.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)  # what a killed attempt left
    partial.mkdir(parents=True)
    rc = run_local(config_path, run_dir=partial, progress=False, start=start)
    if rc != 0 or not is_completed(partial):
        return rc or 1
    shutil.copyfile(meta_path, partial / RUN_META)
    complete(partial, dest)
    return 0


def run_sweep(sweep: Sweep, out: Path, jobs: int, quiet: bool, start: str = "warm") -> int:
    """Run the runs not yet done, ``jobs`` at a time; write the table; 1 if any run failed. Ctrl-C or
    SIGTERM stops every run it started (passing the signal on, which each run records) and ends the
    sweep with one line and exit code 130; the same command resumes it."""
    from vflnet.runner.local import stop_processes
    from vflnet.tools.experiments.plan import plan_json

    configs_dir, runs_dir, logs_dir = out / "configs", out / "runs", out / "logs"
    for d in (configs_dir, runs_dir, logs_dir):
        d.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sweep.json", json.dumps(plan_json(sweep), indent=2))
    pending = [r for r in sweep.runs if not is_completed(runs_dir / r.name)]
    running: dict[str, Process] = {}
    failed: list[str] = []
    try:
        with (
            interruptible(),
            progress.runs(
                f"sweep {sweep.name}",
                len(sweep.runs),
                initial=len(sweep.runs) - len(pending),
                shown=not quiet,
            ),
            _sweep_server(sweep, start) as server,
        ):
            stop_with = signal.SIGTERM
            try:
                while pending or running:
                    while pending and len(running) < jobs:
                        run = pending.pop(0)
                        running[run.name] = _start(sweep, run, out, start, server)
                    time.sleep(0.2)
                    for name, proc in list(running.items()):
                        if proc.poll() is None:
                            continue
                        del running[name]
                        progress.advance(name)
                        if proc.returncode != 0:
                            failed.append(name)
                            progress.note(
                                f"run {name} FAILED (exit {proc.returncode}); log: {logs_dir / name}.log"
                            )
            except KeyboardInterrupt as exc:
                stop_with = signal_of(exc)
                raise
            finally:  # no run goes on without the sweep
                stop_processes(list(running.values()), sig=stop_with)
    except KeyboardInterrupt as exc:
        done = sum(is_completed(runs_dir / r.name) for r in sweep.runs)
        print(
            f"\nsweep {sweep.name} interrupted ({signal_of(exc).name}): {done}/{len(sweep.runs)} runs done; "
            "the same command resumes it",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
    # this plan's runs only: runs of an earlier version of the sweep file may share the folder
    csv_path, _ = write_table(collect(runs_dir, {r.name for r in sweep.runs}), out)
    if not quiet:
        print(
            f"sweep {sweep.name}: {len(sweep.runs) - len(failed)}/{len(sweep.runs)} runs done; table {csv_path}"
        )
    if failed:
        print(f"failed runs: {', '.join(failed)} (run the sweep again to retry them)", file=sys.stderr)
    return 1 if failed else 0


@contextmanager
def _sweep_server(sweep: Sweep, start: str) -> Iterator[ForkServer | None]:
    """The fork server every run of the sweep starts from (warm start), for its first run's torch
    threads: the one this process was offered (a resident server's) when it is for those threads,
    else one of its own. A run that asks for other threads starts its role processes from a server
    of its own."""
    if start == "cold":
        yield None
        return
    threads = sweep.runs[0].config.get("runtime", {}).get("torch_threads", RuntimeConfig().torch_threads)
    offered = shared_server()
    if offered is not None and offered.torch_threads == threads:
        yield offered
        return
    with fork_server(threads) as server:
        yield server


def _start(sweep: Sweep, run: PlannedRun, out: Path, start: str, server: ForkServer | None) -> Process:
    config_path, meta_path = write_run_files(sweep, run, out / "configs")
    args = [
        "sweep",
        "one",
        str(config_path),
        "--meta",
        str(meta_path),
        "--dest",
        str(out / "runs" / run.name),
    ]
    args += ["--start", start]
    # the run starts its role processes from the same server
    env = dict(os.environ) if server is None else dict(os.environ, **server.offer())
    with (out / "logs" / f"{run.name}.log").open("wb") as log:
        # the run dies with the sweep, so a killed sweep leaves no run behind
        return start_vflnet(args, env, log, server, timeout_s=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet sweep",
        description="run a sweep file's runs (grid/zip over config keys, several seeds) and tabulate them; "
        "`vflnet sweep collect DIR --out OUT` tabulates a Kubernetes results volume (docs/experiments.md)",
    )
    parser.add_argument("sweep", type=Path, help="sweep file (YAML)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="set a key of the base run config (as `vflnet run` does); a key the sweep file sets, "
        "varies or seeds is refused",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: sweeps/<sweep name>)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="runs at a time (default: cores)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary line")
    add_start_argument(parser)
    parser.add_argument(
        "--emit",
        choices=["k8s"],
        default=None,
        help="write Kubernetes manifests (one Job per run) instead of running",
    )
    # the usage names both forms, as the description does
    usages = (p.format_usage().removeprefix("usage: ").strip() for p in (parser, _collect_parser()))
    parser.usage = "\n       ".join(usages)
    return parser


def _collect_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet sweep collect", description="tabulate the run directories under DIR (a results volume)"
    )
    parser.add_argument(
        "dir", type=Path, help="a folder of run directories, e.g. a copy of the /results volume"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for results.csv and results.json")
    return parser


def _one_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet sweep one", description="run one sweep run into DEST (what each sweep worker runs)"
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("--meta", type=Path, required=True, help="the run's sweep-run.json")
    parser.add_argument(
        "--dest", type=Path, required=True, help="its run directory, created when it completes"
    )
    add_start_argument(parser)
    return parser


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    if argv[:1] == ["collect"]:
        args = _collect_parser().parse_args(argv[1:])
        if not args.dir.is_dir():
            print(f"error: {args.dir} is not a directory", file=sys.stderr)
            return 2
        rows = collect(args.dir)
        csv_path, json_path = write_table(rows, args.out)
        print(f"wrote {csv_path} and {json_path} ({len(rows)} runs)")
        return 0
    if argv[:1] == ["one"]:
        args = _one_parser().parse_args(argv[1:])
        return run_one(args.config, args.meta, args.dest, args.start)
    args = build_parser().parse_intermixed_args(argv)
    from vflnet.tools.experiments.plan import load_sweep

    sweep = load_sweep(args.sweep, args.overrides)
    out = args.out or Path("sweeps") / sweep.name
    if args.emit == "k8s":
        from vflnet.tools.experiments.k8s import emit

        written = emit(sweep, out)
        print(f"wrote {written} ({len(sweep.runs)} Jobs) and {out / 'sweep.json'}")
        return 0
    if args.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2
    return run_sweep(sweep, out, args.jobs, args.quiet, args.start)
