"""`vflnet bench scaling`: step time, CPU seconds and peak memory of every role against the number of
passive parties K, from a real local cluster (one process per party, gRPC on loopback).

The task is digits split into K vertical strips of the 8x8 image (K divides 8), one per passive party,
each with an MLP bottom (hidden 32, out 16); the active party holds the labels and the top MLP over
the concatenated embeddings. Each run trains `--steps` steps of batch `--batch`.

While a run lasts, this process samples every party's /proc/<pid>/stat (user + system CPU time) and
/proc/<pid>/status (VmHWM: the peak resident set) every 0.1 s, keeping the last values read before the
process exits. Per role it reports the process's total CPU seconds (start-up and imports included),
its CPU seconds per training step (between the first and the last step's record in metrics.jsonl) and
its peak RSS; for the passive parties, the mean and the largest over the K of them. Step time is the
coordinator's, mean over steps 2..N (from metrics.jsonl).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vflnet import progress
from vflnet.tools.bench.common import Row, markdown_table, parse_args, run_cluster, scratch, write_json
from vflnet.tools.bench.he_step import step_times

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.1


def scaling_config(k: int, steps: int, batch: int) -> dict[str, Any]:
    """Digits with K passive parties, each holding an 8 x (8 / K) strip."""
    if 8 % k:
        raise ValueError(f"K = {k} must divide the 8 image columns")
    width = 8 // k
    passives = [
        {
            "name": f"passive-{i + 1}",
            "role": "passive",
            "features": {"region": [0, 8, i * width, (i + 1) * width]},
            "bottom": {"kind": "mlp", "hidden": [32], "out": 16},
        }
        for i in range(k)
    ]
    return {
        "run": {"id": f"bench-scaling-k{k}", "seed": 0},
        "protocol": {"kind": "split", "aggregation": "concat"},
        "data": {"dataset": "digits"},
        "parties": [{"name": "coordinator", "role": "coordinator"}, {"name": "active", "role": "active"}]
        + passives,
        "model": {"top": {"kind": "mlp", "hidden": [32]}},
        "train": {
            "epochs": 1000,
            "batch_size": batch,
            "max_steps": steps,
            "eval_every": 10**6,
            "optimizer": {"kind": "adam", "lr": 0.003},
        },
        # K + 2 processes importing torch on a shared machine can take minutes to join
        "transport": {"join_timeout_s": 600, "rpc_timeout_s": 300},
    }


@dataclass
class Usage:
    """The last /proc figures read of one process; CPU seconds when the first and the last step ended."""

    cpu_s: float = 0.0
    peak_rss_mib: float = 0.0
    marks: dict[int, float] = field(default_factory=dict)


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


class Sampler(threading.Thread):
    """Samples every party process of a run directory until stopped (see the module doc)."""

    def __init__(self, run_dir: Path, steps: int) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.steps = run_dir, steps
        self.usage: dict[str, Usage] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        pids: dict[str, int] = {}
        while not self.stop.wait(SAMPLE_S):
            if not pids:
                with contextlib.suppress(OSError, ValueError):  # not written yet, or half written
                    procs = json.loads((self.run_dir / "processes.json").read_text())
                    pids = {name: p["pid"] for name, p in procs.items()}
            done = self._steps_done()
            for name, pid in pids.items():
                got = read_proc(pid)
                if got is None:
                    continue
                u = self.usage.setdefault(name, Usage())
                # max: an exited process not yet reaped (a zombie) still has its CPU times, no VmHWM
                u.cpu_s, u.peak_rss_mib = max(u.cpu_s, got[0]), max(u.peak_rss_mib, got[1])
                for mark in (1, self.steps):
                    if done >= mark:
                        u.marks.setdefault(mark, u.cpu_s)

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
        per_step = [
            (u.marks[steps] - u.marks[1]) / (steps - 1) * 1000
            for u in usages
            if 1 in u.marks and steps in u.marks
        ]
        rows.append(
            {
                "K": k,
                "role": role if role != "passive" else f"passive (mean of {k})",
                "step_ms": step_ms,
                "cpu_s": sum(u.cpu_s for u in usages) / len(usages),
                "cpu_ms_per_step": sum(per_step) / len(per_step) if per_step else None,
                "peak_rss_mib": sum(u.peak_rss_mib for u in usages) / len(usages),
                "max_peak_rss_mib": max(u.peak_rss_mib for u in usages),
                "bytes_per_step": times.bytes_per_step,
            }
        )
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vflnet bench scaling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--parties", type=int, nargs="+", default=[1, 2, 4, 8], help="values of K (divide 8)")
    p.add_argument("--steps", type=int, default=100, help="training steps per run (>= 2)")
    p.add_argument("--batch", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv, smoke={"parties": [1, 2], "steps": 6})
    if args.steps < 2 or any(8 % k for k in args.parties):
        parser.error("--steps must be >= 2 and every K must divide 8")
    rows: list[Row] = []
    with progress.runs("bench scaling", total=len(args.parties)):
        for k in args.parties:
            rows += measure(k, args.steps, args.batch)
            progress.advance(f"K={k}")
    print(f"digits, K passive parties over gRPC, {args.steps} steps of batch {args.batch}\n")
    print(markdown_table(rows))
    print(
        "\nstep_ms: coordinator-timed step, mean over steps 2..N; cpu_s: the process's CPU seconds from start to "
        "exit; cpu_ms_per_step: between the first and last step; peak_rss_mib: VmHWM (passive: mean, and the "
        "largest); bytes_per_step: every party message of a step"
    )
    write_json(args.json, rows, steps=args.steps, batch=args.batch)
    return 0
