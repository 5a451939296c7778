"""`vflnet bench startup`: how long vflnet takes to start processes, cold against warm, in one invocation.

- party: seconds from asking for a role process to its gRPC health check answering SERVING, for the
  coordinator and then a passive party (which serves before it joins); cold: a new `python -m vflnet
  party`, warm: forked from a fork server that has finished importing (vflnet/runner/warm.py);
- fork server: seconds from starting one to its first child (its imports; a warm run or sweep pays it
  once);
- run: wall seconds of a whole `vflnet run` command on configs/digits-2p.yaml (`make demo`'s run),
  and its overhead: the wall minus the training (the epochs' time_s in metrics.jsonl);
- sweep: `vflnet sweep configs/sweeps/dp-label-leak.yaml --jobs 1` (--smoke: its first two runs), the
  wall time per run and the overhead per run (wall minus the runs' training, per run), and whether
  its results table is the same under every start;
- resident: the run and the sweep again, each command sent to a resident fork server (`vflnet warm
  start`, vflnet/runner/resident.py, in a folder of this bench's own) started before them; and that
  server's start.
The cold and warm commands run with ``VFLNET_RESIDENT=off``: a resident server of the user's is never
measured in their place.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import grpc
import yaml

from vflnet.config import Config
from vflnet.example_configs import EXAMPLES
from vflnet.runner import resident
from vflnet.runner.local import START_MODES, free_port, stop_processes
from vflnet.runner.warm import SOCKET_ENV, ForkServer, Process, fork_server, role_env, start_vflnet
from vflnet.tools.bench.common import Row, parse_args, scratch, write_json
from vflnet.tools.experiments.results import collect, sweep_run_dirs
from vflnet.wire.healthcheck import check

LIMIT_S = 300.0  # any one start, on a loaded machine
COMMAND_STARTS = (*START_MODES, "resident")  # how a whole command (a run, a sweep) may start


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vflnet bench startup", description=__doc__)
    p.add_argument("--repeat", type=int, default=3, help="starts of each party and runs of each kind")
    p.add_argument("--sweep-runs", type=int, default=0, help="the sweep's first N runs (0: all)")
    return p


def _config(folder: Path) -> Path:
    data = yaml.safe_load((EXAMPLES / "digits-2p.yaml").read_text())
    data["run"] = {**data.get("run", {}), "id": "bench-startup", "dir": str(folder / "runs")}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _serving_s(
    args: list[str], log: IO[bytes], server: ForkServer | None, torch_threads: int, address: str
) -> tuple[float, Process]:
    """Seconds from starting ``vflnet ARGS`` to its health check answering SERVING at ``address``."""
    began = time.perf_counter()
    proc = start_vflnet(args, role_env(torch_threads), log, server, LIMIT_S)
    while time.perf_counter() - began < LIMIT_S:
        try:
            if check(address, timeout=1.0) == "SERVING":
                return time.perf_counter() - began, proc
        except grpc.RpcError:  # not listening yet
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the process ended ({proc.returncode}) before serving at {address}")
        time.sleep(0.01)
    raise RuntimeError(f"nothing served at {address} within {LIMIT_S:.0f} s")


def _party_starts(config: Path, folder: Path, server: ForkServer | None, torch_threads: int) -> list[float]:
    """A coordinator's and a passive party's seconds to serving; both stopped after."""
    coord, passive = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    common = ["--config", str(config), "--run-dir", str(folder)]
    parties = (
        (["--role", "coordinator", "--name", "coordinator", "--listen", coord], coord),
        (["--role", "passive", "--name", "passive-1", "--listen", passive, "--coordinator", coord], passive),
    )
    procs: list[Process] = []
    times = []
    with (folder / "party.log").open("ab") as log:
        try:
            for args, address in parties:
                took, proc = _serving_s(["party", *args, *common], log, server, torch_threads, address)
                procs.append(proc)
                times.append(took)
        finally:
            stop_processes(procs)
    return times


def _command_env(start: str, folder: Path) -> dict[str, str]:
    """The environment of a measured command: no server offered to it, and a resident server only
    for ``resident`` (this bench's own, in ``folder / "rt"``)."""
    env = {k: v for k, v in os.environ.items() if k not in (SOCKET_ENV, resident.OFF_ENV)}
    if start == "resident":
        return {**env, resident.DIR_ENV: str(folder / "rt")}
    return {**env, resident.OFF_ENV: "off"}


def _command(args: list[str], log: Path, env: dict[str, str]) -> float:
    began = time.perf_counter()
    with log.open("wb") as out:
        rc = subprocess.run(
            [sys.executable, "-m", "vflnet", *args], stdout=out, stderr=subprocess.STDOUT, env=env
        ).returncode
    if rc != 0:
        raise RuntimeError(f"vflnet {' '.join(args)} failed ({rc}); see {log}")
    return time.perf_counter() - began


def _training_s(run_dirs: list[Path]) -> float:
    """The runs' training time: their epochs' time_s in metrics.jsonl, added up."""
    records = (json.loads(line) for d in run_dirs for line in (d / "metrics.jsonl").read_text().splitlines())
    return sum(r["time_s"] for r in records if r["kind"] == "epoch")


def _sweep_file(folder: Path, runs: int) -> Path:
    """dp-label-leak, its base made absolute; with ``runs``, only its first noise scales."""
    source = EXAMPLES / "sweeps" / "dp-label-leak.yaml"
    data = yaml.safe_load(source.read_text())
    data["base"] = str((source.parent / data["base"]).resolve())
    if runs:
        key = next(iter(data["grid"]))
        data["grid"][key] = data["grid"][key][: max(1, runs // len(data["seeds"]))]
    path = folder / "dp-label-leak.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _sweeps(folder: Path, sweep_runs: int) -> dict[str, dict[str, Any]]:
    """The sweep's first ``sweep_runs`` runs under each start: wall and overhead per run, results."""
    sweep = _sweep_file(folder, sweep_runs)
    per_run: dict[str, dict[str, Any]] = {}
    for start in COMMAND_STARTS:
        out = folder / f"sweep-{start}"
        wall = _command(
            ["sweep", str(sweep), "--out", str(out), "--jobs", "1", "--quiet"]
            + ([] if start == "resident" else ["--start", start]),
            folder / f"sweep-{start}.log",
            _command_env(start, folder),
        )
        dirs = sweep_run_dirs(out / "runs")
        per_run[start] = {
            "wall": wall / len(dirs),
            "overhead": (wall - _training_s(dirs)) / len(dirs),
            "results": [{k: v for k, v in r.items() if k != "wall_time_s"} for r in collect(out / "runs")],
            "runs": len(dirs),
        }
    return per_run


def measure(repeat: int, sweep_runs: int) -> tuple[list[Row], bool]:
    """The rows of the table (``what``, ``cold_s``, ``warm_s``, ``resident_s``): party starts (median of
    ``repeat``), the resident server's start, the demo's run (median of ``repeat``) and the sweep (its
    first ``sweep_runs`` runs, 0: all); and whether the sweep's results are the same under every start."""
    threads = Config().runtime.torch_threads
    rows: list[Row] = []
    with scratch("vflnet-bench-startup-") as tmp:
        folder = Path(tmp)
        config = _config(folder)
        print(f"load average {os.getloadavg()[0]:.1f} at the start, {os.cpu_count()} cores", flush=True)

        began = time.perf_counter()
        with fork_server(threads) as server, (folder / "server.log").open("ab") as log:
            server.spawn(["--version"], role_env(threads), log, LIMIT_S).wait(LIMIT_S)
            rows.append({"what": "fork server: start to first child", "warm_s": time.perf_counter() - began})
            party: dict[str, list[list[float]]] = {start: [] for start in START_MODES}
            for i in range(repeat):
                for start in START_MODES:
                    where = folder / f"party-{start}-{i}"
                    where.mkdir()
                    party[start].append(
                        _party_starts(config, where, server if start == "warm" else None, threads)
                    )
        for j, role in enumerate(("coordinator", "passive party")):
            cold, warm = (statistics.median(t[j] for t in party[s]) for s in ("cold", "warm"))
            rows.append({"what": f"{role}: start to serving", "cold_s": cold, "warm_s": warm})

        began = time.perf_counter()
        _command(["warm", "start"], folder / "resident-start.log", _command_env("resident", folder))
        rows.append(
            {"what": "resident server: `vflnet warm start`", "resident_s": time.perf_counter() - began}
        )
        try:
            walls: dict[str, list[float]] = {start: [] for start in COMMAND_STARTS}
            overheads: dict[str, list[float]] = {start: [] for start in COMMAND_STARTS}
            for i in range(repeat):
                for start in COMMAND_STARTS:
                    run_dir = folder / f"run-{start}-{i}"
                    wall = _command(
                        ["run", str(config), "--run-dir", str(run_dir), "--no-progress"]
                        + ([] if start == "resident" else ["--start", start]),
                        folder / f"{run_dir.name}.log",
                        _command_env(start, folder),
                    )
                    walls[start].append(wall)
                    overheads[start].append(wall - _training_s([run_dir]))
            rows.append(
                {"what": "run: command wall"}
                | {f"{s}_s": statistics.median(walls[s]) for s in COMMAND_STARTS}
            )
            rows.append(
                {"what": "run: overhead (wall - training)"}
                | {f"{s}_s": statistics.median(overheads[s]) for s in COMMAND_STARTS}
            )

            per_run = _sweeps(folder, sweep_runs)
        finally:
            _command(["warm", "stop"], folder / "resident-stop.log", _command_env("resident", folder))
        n = per_run["warm"]["runs"]
        rows.append(
            {"what": f"sweep dp-label-leak ({n} runs): wall per run"}
            | {f"{s}_s": per_run[s]["wall"] for s in COMMAND_STARTS}
        )
        rows.append(
            {"what": "sweep: overhead per run"} | {f"{s}_s": per_run[s]["overhead"] for s in COMMAND_STARTS}
        )
        same = all(per_run[s]["results"] == per_run["cold"]["results"] for s in COMMAND_STARTS)
    return rows, same


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv, {"repeat": 1, "sweep_runs": 2})
    rows, same = measure(args.repeat, args.sweep_runs)
    load = os.getloadavg()[0]
    print(f"{'':48}{'cold s':>10}{'warm s':>10}{'resident s':>12}")
    for row in rows:
        cells = "".join(
            f"{row[k]:>{w}.2f}" if k in row else f"{'-':>{w}}"
            for k, w in (("cold_s", 10), ("warm_s", 10), ("resident_s", 12))
        )
        print(f"{row['what']:<48}{cells}")
    print(
        f"sweep results identical under every start: {'yes' if same else 'NO'}; load average {load:.1f} at the end"
    )
    write_json(args.json, rows, sweep_results_identical=same, load_average_end=load)
    return 0 if same else 1
