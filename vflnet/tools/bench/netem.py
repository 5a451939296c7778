"""`vflnet bench netem`: step time of a split run over the network lab under one-way delays, against
2 x delay, in one invocation.

For each delay (default 0, 10 and 50 ms, one-way, on every host's egress: `vflnet lab --netem "delay
D"`, 0 ms too, so that every row goes through the same emulator), the lab is brought up, configs/digits-2p.yaml runs across its namespaces (its first
``--epochs``), and the lab is taken down. Per delay:

- step: the median training step time (``step_time_s`` in metrics.jsonl: from a step's command, or
  the step before it completing if that was later, to its reports being in), with p10 and p90;
- 2 x delay: one passive-active round trip of the link alone (embeddings up, gradients down), the
  step's critical path without compute (docs/architecture.md, "Pipelined steps");
- excess: step - 2 x delay; goal: 2 x delay + the step at 0 ms + 3 ms, where the step at
  0 ms (same lab, same invocation) stands for the compute;
- wire: the median round trip of plain TCP between the first passive party's and the active party's
  namespaces with the step's message sizes (its embeddings up, its gradients down, from the run's
  byte counts), and step - wire: what the run adds to the network's own cost of the exchange. Under
  the lab's emulator and the host's TCP (congestion control in the row) a message of a few KB takes
  longer than the delay: TCP paces it out at the rate it has measured on this link (`--tcp-cc reno`
  gives the lab's hosts a congestion control that does not pace).

Needs root and network namespaces (`vflnet lab`); elsewhere it says why and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import yaml

from vflnet.example_configs import EXAMPLES
from vflnet.tools.bench.common import Row, parse_args, scratch, write_json
from vflnet.tools.lab.netlab import Lab, LabError, down, in_netns, tcp_cc_refusal, unavailable_reason, up

ECHO_PORT = 7099  # the wire probe's port inside the active party's namespace
WIRE_WARMUP = 3  # round trips before the measured ones (the connection's first flights)
GOAL_MARGIN_MS = 3.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vflnet bench netem", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--delays", type=float, nargs="+", default=[0.0, 10.0, 50.0], help="one-way delays in ms")
    p.add_argument("--epochs", type=int, default=3, help="epochs of configs/digits-2p.yaml per delay")
    p.add_argument("--wire-trips", type=int, default=30, help="round trips of the plain-TCP probe")
    p.add_argument("--prefix", default="bench", help="the lab's namespace prefix (one lab at a time)")
    p.add_argument("--emulator", choices=["auto", "netem", "userspace"], default="auto")
    p.add_argument(
        "--tcp-cc",
        default="",
        metavar="NAME",
        help="the lab hosts' TCP congestion control (e.g. reno; default: the machine's, shown in the tcp column)",
    )
    return p


def _load() -> float:
    return os.getloadavg()[0]


def _recv_exactly(sock: socket.socket, n: int) -> None:
    while n:
        chunk = sock.recv(min(n, 1 << 16))
        if not chunk:
            raise ConnectionError("the wire probe's peer closed the connection")
        n -= len(chunk)


def wire_round_trip_ms(lab: Lab, up_bytes: int, down_bytes: int, trips: int) -> tuple[float, str]:
    """Median ms of a plain TCP round trip (``up_bytes`` from the first passive party's namespace to the
    active party's, ``down_bytes`` back) on one connection, as gRPC keeps one; and the congestion
    control the connection used."""
    active = next(h for h in lab.hosts if h.role == "active")
    passive = next(h for h in lab.hosts if h.role == "passive")
    listening = threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        with socket.socket() as ls:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((active.address, ECHO_PORT))
            ls.listen(1)
            ls.settimeout(30)
            listening.set()
            conn, _ = ls.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reply = b"g" * down_bytes
                for _ in range(WIRE_WARMUP + trips):
                    _recv_exactly(conn, up_bytes)
                    conn.sendall(reply)

    def server() -> None:
        try:
            in_netns(active.ns, serve, timeout=600)
        except BaseException as exc:  # reported by the client side below
            failure.append(exc)
            listening.set()

    def client() -> tuple[list[float], str]:
        with socket.create_connection((active.address, ECHO_PORT), timeout=30) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()
            request, times = b"e" * up_bytes, []
            for _ in range(WIRE_WARMUP + trips):
                start = time.perf_counter()
                s.sendall(request)
                _recv_exactly(s, down_bytes)
                times.append((time.perf_counter() - start) * 1000)
            return times[WIRE_WARMUP:], cc

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    listening.wait(60)
    if failure:
        raise failure[0]
    times, cc = in_netns(passive.ns, client, timeout=600)
    thread.join(60)
    return statistics.median(times), cc


def _config(folder: Path, epochs: int) -> Path:
    data = yaml.safe_load((EXAMPLES / "digits-2p.yaml").read_text())
    data["train"]["epochs"] = epochs
    path = folder / "digits-2p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _per_step_bytes(run_dir: Path, passive: str, active: str, n_passives: int) -> tuple[int, int]:
    """One passive party's embeddings message and the active party's gradients message to it, in bytes
    per training step (the run's metered bytes: protobuf messages, as gRPC frames them)."""

    steps = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"kind": "step"' in line
    ]
    up_bytes = statistics.median(s["bytes_sent"].get(f"{passive}/ExchangeEmbeddings", 0) for s in steps)
    down_bytes = statistics.median(
        s["bytes_sent"].get(f"{active}/ExchangeEmbeddings.reply", 0) for s in steps
    )
    return max(1, int(up_bytes)), max(1, int(down_bytes / n_passives))


def _step_times_ms(run_dir: Path) -> list[float]:

    return [
        r["step_time_s"] * 1000
        for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
        if r.get("kind") == "step"
    ]


def measure(delay_ms: float, config: Path, folder: Path, args: argparse.Namespace) -> Row:
    from vflnet.tools.lab.run import run_lab

    netem = f"delay {delay_ms:g}ms"  # 0 ms too: every delay goes through the same emulator
    load_before = _load()
    lab = up(
        config,
        prefix=args.prefix,
        lab_dir=folder / f"lab-{delay_ms:g}",
        netem=netem,
        emulator=args.emulator,
        tcp_cc=args.tcp_cc,
    )
    try:
        result = run_lab(lab, timeout_s=900.0)
        if result.rc != 0:
            raise RuntimeError(
                f"the lab run at {delay_ms:g} ms failed (rc {result.rc}); logs: {result.run_dir}"
            )
        times = _step_times_ms(result.run_dir)
        passives = [h.name for h in lab.hosts if h.role == "passive"]
        active = next(h.name for h in lab.hosts if h.role == "active")
        up_bytes, down_bytes = _per_step_bytes(result.run_dir, passives[0], active, len(passives))
        wire, cc = wire_round_trip_ms(lab, up_bytes, down_bytes, args.wire_trips)
    finally:
        down(args.prefix)
    deciles = statistics.quantiles(times, n=10)
    step = statistics.median(times)
    return {
        "delay_ms": delay_ms,
        "steps": len(times),
        "step_ms": step,
        "p10_ms": deciles[0],
        "p90_ms": deciles[-1],
        "2x_delay_ms": 2 * delay_ms,
        "excess_ms": step - 2 * delay_ms,
        "wire_ms": wire,
        "step_minus_wire_ms": step - wire,
        "message_bytes": f"{up_bytes} up / {down_bytes} down",
        "tcp": cc,
        "emulator": lab.emulator,
        "load": f"{load_before:.1f} -> {_load():.1f}",
    }


def measure_delays(args: argparse.Namespace) -> list[Row]:
    """A row per delay of ``args`` (this module's flags, build_parser()), each lab up and down in turn;
    with a 0 ms row, each row's goal (``goal_ms``) and whether its step met it (``met``)."""
    rows: list[Row] = []
    with scratch("vflnet-bench-netem-") as tmp:
        folder = Path(tmp)
        config = _config(folder, args.epochs)
        for delay in args.delays:
            rows.append(measure(delay, config, folder, args))
    zero = next((r for r in rows if r["delay_ms"] == 0), None)
    for r in rows:
        if zero is not None:
            goal = float(r["2x_delay_ms"]) + float(zero["step_ms"]) + GOAL_MARGIN_MS  # type: ignore[arg-type]
            r["goal_ms"] = goal
            r["met"] = float(r["step_ms"]) <= goal  # type: ignore[arg-type]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv, {"delays": [0.0, 10.0], "epochs": 1, "wire_trips": 10})
    refused = tcp_cc_refusal(args.tcp_cc)
    if refused:
        print(f"vflnet bench netem: --tcp-cc: {refused}", file=sys.stderr)
        return 2
    why = unavailable_reason()
    if why is not None:
        print(f"vflnet bench netem: skipped: {why}")
        write_json(args.json, [], skipped=why)
        return 0
    try:
        rows = measure_delays(args)
    except LabError as exc:  # the lab could not come up (a lab of this prefix is up, a sysctl refused)
        print(f"vflnet bench netem: {exc}", file=sys.stderr)
        return 2
    _print(rows)
    write_json(
        args.json,
        rows,
        cores=os.cpu_count(),
        goal=f"step <= 2 x delay + the step at 0 ms + {GOAL_MARGIN_MS:g} ms",
    )
    return 0


def _print(rows: list[Row]) -> None:
    print(
        f"\n{'delay':>7} {'step':>8} {'p10':>7} {'p90':>7} {'2xdelay':>8} {'excess':>7} {'goal':>7} "
        f"{'wire':>7} {'step-wire':>9}  messages, tcp, emulator, load"
    )
    for r in rows:
        goal = r.get("goal_ms")
        print(
            f"{r['delay_ms']:>5g}ms {r['step_ms']:>6.1f}ms {r['p10_ms']:>5.1f}ms {r['p90_ms']:>5.1f}ms "
            f"{r['2x_delay_ms']:>6g}ms {r['excess_ms']:>5.1f}ms "
            + (f"{goal:>5.1f}ms" if isinstance(goal, float) else f"{'-':>7}")
            + f" {r['wire_ms']:>5.1f}ms {r['step_minus_wire_ms']:>7.1f}ms  "
            f"{r['message_bytes']}, {r['tcp']}, {r['emulator']}, load {r['load']}"
        )
    print(
        "\nstep: median training step; excess: step - 2 x delay; goal: 2 x delay + the step at 0 ms + "
        f"{GOAL_MARGIN_MS:g} ms; wire: median plain-TCP round trip of the step's messages between the "
        "passive and the active party's namespaces; step-wire: what the run adds to that round trip."
    )
