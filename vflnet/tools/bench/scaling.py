"""`vflnet bench scaling`: step time, CPU and memory of every role against the number of passive
parties K, from a real local cluster (one process per party, gRPC on loopback).

The task is a synthetic table (`synthetic`, 256 columns, 2,000 rows, 2 classes) whose columns are cut
into K blocks of equal width (+-1 column; any K up to 256), one per passive party, each with an MLP
bottom (hidden 32, out 16); the active party holds the labels and the top MLP over the concatenated
embeddings. Each run trains `--steps` steps of batch `--batch`.

While a run lasts, this process samples every party's /proc/<pid>/stat (user + system CPU time) and
/proc/<pid>/status (VmHWM: the peak resident set) every 0.02 s, and /proc/<pid>/smaps_rollup (Pss: the
proportional set size) of every party and of the fork server they were forked from every 1 s and when
the first and the last step end (a read costs ~3 ms of CPU per process). Warm role processes share the fork server's pages (torch), which RSS
counts once in every process and PSS divides among those sharing them: the sum of PSS is the memory
the cluster holds, the sum of RSS counts each shared page once per process.

Per role it reports the process's total CPU seconds (start-up included), its CPU milliseconds per
training step (between the first sample after the first step's record in metrics.jsonl and the last
sample up to the first one after the last step's, divided by the steps recorded in between), its peak
PSS and peak RSS; for the passive parties, the mean and the largest over the K of them. Per K: the coordinator's
step time, mean over steps 2..N (from metrics.jsonl), and the cluster's peak total PSS (every party and
the fork server, summed at each sample) beside the same sum of RSS. After the table, per role, the
slope of CPU ms per step against K (least squares): the cost of one more passive party.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vflnet import progress
from vflnet.config import TransportConfig, calls_at_once
from vflnet.tools.bench.common import Row, markdown_table, parse_args, run_cluster, scratch, write_json
from vflnet.tools.bench.he_step import step_times

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.02
PSS_EVERY = 50  # samples: PSS once a second
COLUMNS = 256
DEFAULT_CALLS = TransportConfig().max_concurrent_rpcs
ROWS = 2000


def column_blocks(k: int, width: int = COLUMNS) -> list[str]:
    """K contiguous column ranges ``"a:b"`` covering ``width`` columns, widths differing by at most 1."""
    if not 1 <= k <= width:
        raise ValueError(f"K = {k}: the table has {width} columns, K must lie in 1..{width}")
    edges = [i * width // k for i in range(k + 1)]
    return [f"{a}:{b}" for a, b in zip(edges, edges[1:], strict=False)]


def scaling_config(k: int, steps: int, batch: int) -> dict[str, Any]:
    """The synthetic table with K passive parties, each holding a block of its columns."""
    passives = [
        {
            "name": f"passive-{i + 1}",
            "role": "passive",
            "features": {"columns": block},
            "bottom": {"kind": "mlp", "hidden": [32], "out": 16},
        }
        for i, block in enumerate(column_blocks(k))
    ]
    return {
        "run": {"id": f"bench-scaling-k{k}", "seed": 0},
        "protocol": {"kind": "split", "aggregation": "concat"},
        "data": {"dataset": "synthetic", "params": {"n_samples": ROWS, "n_features": COLUMNS}},
        "parties": [{"name": "coordinator", "role": "coordinator"}, {"name": "active", "role": "active"}]
        + passives,
        "model": {"top": {"kind": "mlp", "hidden": [32]}},
        "train": {
            "epochs": 1000,
            "batch_size": batch,
            "max_steps": steps,
            "eval_every": 0,  # a benchmark that only trains
            "optimizer": {"kind": "adam", "lr": 0.003},
        },
        # K + 2 processes on a shared machine can take minutes to join; past ~60 parties the default
        # max_concurrent_rpcs no longer covers the roster (vflnet.config.calls_at_once)
        "transport": {"join_timeout_s": 600, "rpc_timeout_s": 300}
        | ({"max_concurrent_rpcs": calls} if (calls := calls_at_once(k + 2)) > DEFAULT_CALLS else {}),
    }


@dataclass
class Usage:
    """The last /proc figures read of one process; (steps done, CPU seconds) at the first sample after
    the first step and at the last sample up to the first one after the last step."""

    cpu_s: float = 0.0
    peak_rss_mib: float = 0.0
    peak_pss_mib: float = 0.0
    first: tuple[int, float] | None = None
    last: tuple[int, float] | None = None

    def mark(self, done: int, steps: int) -> bool:
        """Take the sample's mark at ``done`` steps of ``steps``; whether one was taken."""
        if done < 1 or (self.last is not None and self.last[0] >= steps):
            return False
        self.last = (done, self.cpu_s)
        self.first = self.first or self.last
        return True

    def cpu_ms_per_step(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0]) * 1000


def read_proc(pid: int) -> tuple[float, float] | None:
    """(user + system CPU seconds, VmHWM in MiB; 0 once it has exited) of a process, None once it has
    been reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": fields 3.. of proc(5)
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    hwm = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), "0")
    return cpu, int(hwm) / 1024


def read_memory(pid: int) -> tuple[float, float] | None:
    """(Pss, Rss) in MiB of a process now, from /proc/<pid>/smaps_rollup; None once it has exited."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.endswith("kB")}
    if "Pss" not in kib:  # a zombie: no address space left
        return None
    return kib["Pss"] / 1024, kib["Rss"] / 1024


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class Sampler(threading.Thread):
    """Samples every party process of a run directory, and their fork server, until stopped (see the
    module doc)."""

    def __init__(self, run_dir: Path, steps: int) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.steps = run_dir, steps
        self.usage: dict[str, Usage] = {}
        self.cluster_pss_mib = 0.0  # the largest sum over the cluster's processes at one sample
        self.cluster_rss_mib = 0.0
        self.fork_server_pss_mib = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        pids: dict[str, int] = {}
        tick = 0
        while not self.stop.wait(SAMPLE_S):
            if not pids:
                with contextlib.suppress(OSError, ValueError):  # not written yet, or half written
                    procs = json.loads((self.run_dir / "processes.json").read_text())
                    pids = {name: p["pid"] for name, p in procs.items()}
                    server = parent_pid(next(iter(pids.values())))
                    if server is not None and server != os.getpid():  # warm start: their fork server
                        pids["fork server"] = server
            done = self._steps_done()
            marked = False  # a step mark is taken at this sample: memory is read then too (if due)
            for name, pid in pids.items():
                got = read_proc(pid)
                if got is None or name == "fork server":
                    continue
                u = self.usage.setdefault(name, Usage())
                # max: an exited process not yet reaped (a zombie) still has its CPU times, no VmHWM
                u.cpu_s, u.peak_rss_mib = max(u.cpu_s, got[0]), max(u.peak_rss_mib, got[1])
                first_mark = u.first is None
                if u.mark(done, self.steps) and (first_mark or done >= self.steps):
                    marked = True
            if pids and (tick % PSS_EVERY == 0 or marked):  # from the first sample with pids on
                self._sample_memory(pids)
            tick += bool(pids)

    def _sample_memory(self, pids: dict[str, int]) -> None:
        pss_sum = rss_sum = 0.0
        for name, pid in pids.items():
            got = read_memory(pid)
            if got is None:
                continue
            pss_sum, rss_sum = pss_sum + got[0], rss_sum + got[1]
            if name == "fork server":
                self.fork_server_pss_mib = max(self.fork_server_pss_mib, got[0])
            else:
                u = self.usage.setdefault(name, Usage())
                u.peak_pss_mib = max(u.peak_pss_mib, got[0])
        self.cluster_pss_mib = max(self.cluster_pss_mib, pss_sum)
        self.cluster_rss_mib = max(self.cluster_rss_mib, rss_sum)

    def _steps_done(self) -> int:
        try:
            text = (self.run_dir / "metrics.jsonl").read_text()
        except OSError:
            return 0
        return sum(1 for line in text.splitlines() if '"kind": "step"' in line)


def measure(k: int, steps: int, batch: int) -> list[Row]:
    """One run with K passive parties: a row per role (the passive parties folded into one)."""
    with scratch("vflnet-bench-scaling-") as tmp:
        cfg = scaling_config(k, steps, batch)
        cfg["run"]["dir"] = str(tmp)
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run_dir = Path(tmp) / "run"
        sampler = Sampler(run_dir, steps)
        sampler.start()
        try:
            run_cluster(path, run_dir)
        finally:
            sampler.stop.set()
            sampler.join()
        times = step_times(run_dir, steps)
    step_ms = 1000 * times.step_s
    roles = {
        "coordinator": [sampler.usage.get("coordinator", Usage())],
        "active": [sampler.usage.get("active", Usage())],
        "passive": [sampler.usage.get(f"passive-{i + 1}", Usage()) for i in range(k)],
    }
    rows: list[Row] = []
    for role, usages in roles.items():
        per_step = [ms for ms in (u.cpu_ms_per_step() for u in usages) if ms is not None]
        rows.append(
            {
                "K": k,
                "role": role if role != "passive" else f"passive (mean of {k})",
                "step_ms": step_ms,
                "cpu_s": sum(u.cpu_s for u in usages) / len(usages),
                "cpu_ms_per_step": sum(per_step) / len(per_step) if per_step else None,
                "peak_pss_mib": sum(u.peak_pss_mib for u in usages) / len(usages),
                "max_peak_pss_mib": max(u.peak_pss_mib for u in usages),
                "peak_rss_mib": sum(u.peak_rss_mib for u in usages) / len(usages),
                "cluster_pss_mib": sampler.cluster_pss_mib,
                "cluster_rss_mib": sampler.cluster_rss_mib,
                "fork_server_pss_mib": sampler.fork_server_pss_mib,
                "bytes_per_step": times.bytes_per_step,
            }
        )
    return rows


def per_party_cost(rows: list[Row]) -> dict[str, float]:
    """Per role, the least-squares slope of CPU ms per step against K: what one more passive party
    costs it per step (needs two values of K)."""
    slopes: dict[str, float] = {}
    for role in ("coordinator", "active", "passive"):
        points = [
            (float(r["K"]), float(r["cpu_ms_per_step"]))  # type: ignore[arg-type]
            for r in rows
            if str(r["role"]).split()[0] == role and r["cpu_ms_per_step"] is not None
        ]
        if len({k for k, _ in points}) >= 2:
            slopes[role] = float(np.polyfit(*zip(*points, strict=True), 1)[0])
    return slopes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vflnet bench scaling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--parties", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help=f"values of K (1..{COLUMNS})"
    )
    p.add_argument("--steps", type=int, default=100, help="training steps per run (>= 2)")
    p.add_argument("--batch", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv, smoke={"parties": [1, 2, 9], "steps": 40})
    if args.steps < 2 or not all(1 <= k <= COLUMNS for k in args.parties):
        parser.error(f"--steps must be >= 2 and every K must lie in 1..{COLUMNS}")
    rows: list[Row] = []
    with progress.runs("bench scaling", total=len(args.parties)):
        for k in args.parties:
            rows += measure(k, args.steps, args.batch)
            progress.advance(f"K={k}")
    print(
        f"synthetic {ROWS} x {COLUMNS}, K passive parties over gRPC (equal column blocks), "
        f"{args.steps} steps of batch {args.batch}\n"
    )
    print(markdown_table(rows))
    print(
        "\nstep_ms: coordinator-timed step, mean over steps 2..N; cpu_s: the process's CPU seconds from start to "
        "exit; cpu_ms_per_step: from the first to the last step (sampled); peak_pss_mib / peak_rss_mib: the largest "
        "proportional / resident set sampled (passive: mean, and the largest PSS); cluster_pss_mib: the largest "
        "sum of every party's and the fork server's PSS at one sample (cluster_rss_mib: the same sum of RSS, "
        "shared pages counted once per process); bytes_per_step: every party message of a step"
    )
    slopes = per_party_cost(rows)
    if slopes:
        print(
            "\nCPU ms per step per added passive party (least-squares slope over K): "
            + ", ".join(f"{role} {ms:.3f}" for role, ms in slopes.items())
        )
    write_json(args.json, rows, steps=args.steps, batch=args.batch, per_party_cpu_ms=slopes)
    return 0
