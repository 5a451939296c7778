"""`vflnet bench grpc-floor`: the fastest a distributed digits-MLP step can be in Python gRPC here.

The step of `vflnet bench transport`'s digits-mlp-b256 case (two passive parties, each a 32 -> 64 ->
32 MLP bottom on half of the 1,797 x 64 inputs; the active party's 64 -> 64 -> 10 top model; batch
256; Adam, lr 3e-3; one torch thread per process) in separate processes that share nothing of vflnet:
no validation, metering, interceptors, trace or checkpoints, raw float32 bytes as messages, one call
per passive party per step (embeddings up, gradient back). Three ways:

- ``unary``: each passive party runs the steps by itself, one unary call per step;
- ``stream``: the same over one bidirectional stream per passive party for the whole run;
- ``coordinated``: a coordinator (this process) sends every party a unary RunStep per step, two steps
  in flight, and each party runs its steps in order: the message pattern of vflnet's pipelined
  schedule, without the rest of vflnet;
- ``coordinated-stream``: as ``coordinated``, but each passive party's exchanges with the active party
  go over one bidirectional stream for the whole run (the "persistent stream per party pair" design);
- ``all-streams``: as ``coordinated-stream``, and the coordinator's commands and the parties' reports
  also go over one stream per party: every message of the run on a persistent stream.

``--tap`` adds each mode again with the floor of a crash-safe trace tap in every process (the
coordinator too): every message sent or received is appended to the process's file, length-prefixed,
with one ``writev`` before it goes on (what vflnet's TraceWriter does, without the record's metadata).

Next to them, the same steps in one process (the reference). What this says: a design with these
messages cannot beat these figures on this machine; the gap between ``coordinated`` and `vflnet
bench transport`'s grpc column is what the rest of the platform costs. The inputs are random numbers
of the digits shapes: a step's time does not depend on their values.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import torch
from torch import nn

from vflnet import progress
from vflnet.tools.bench.common import Row, markdown_table, parse_args, scratch, write_json

BATCH, FEATURES, EMBEDDING, CLASSES, SAMPLES = 256, 32, 32, 10, 1797
SERVICE = "vflnetfloor.Active"
PASSIVE_SERVICE = "vflnetfloor.Passive"
WARMUP = 20  # steps before the clock starts (connection set-up, first allocations)
SELF_PACED = ("unary", "stream")  # the passive parties run their steps without a coordinator
MODES = (*SELF_PACED, "coordinated", "coordinated-stream", "all-streams")
JOIN_S = 120.0  # a process importing torch on a loaded 2-core machine: start-up is not the measure
TAP = "+tap"
_TAP_FD: list[int] = []  # this process's trace file, with --tap-dir
_TAP_BLOCKS = 0  # with --tap-blocks N: the tap on the steps of even blocks of N steps only (tap_ab)


def _open_tap(directory: str | None, name: str, blocks: int = 0) -> None:
    global _TAP_BLOCKS
    if directory:
        path = os.path.join(directory, f"{name}.trace")
        _TAP_FD.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        _TAP_BLOCKS = blocks


def _close_tap() -> None:
    global _TAP_BLOCKS
    os.close(_TAP_FD.pop())
    _TAP_BLOCKS = 0


def _tapped(data: bytes, step: int) -> bytes:
    """``data`` of ``step``, appended first to this process's trace file when there is one (a tap's
    floor) and ``step`` is not in an odd block of --tap-blocks."""
    if _TAP_FD and not (_TAP_BLOCKS and step // _TAP_BLOCKS % 2):
        os.writev(_TAP_FD[0], [len(data).to_bytes(4, "little"), data])
    return data


def _streamed(handle: Callable[[bytes], bytes]) -> grpc.RpcMethodHandler:
    """A bidirectional-stream handler that answers each request in order, as ``handle`` answers a call."""
    return grpc.stream_stream_rpc_method_handler(lambda requests, context: map(handle, requests))


class _StreamCall:
    """One bidirectional stream, used like a unary call: requests go in order, replies come in order."""

    def __init__(self, channel: grpc.Channel, method: str) -> None:
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.replies = channel.stream_stream(method)(iter(self.outbox.get, None), timeout=JOIN_S * 10)

    def future(self, request: bytes, timeout: float | None = None) -> _StreamCall:
        self.outbox.put(request)
        return self

    def result(self) -> bytes:
        return next(self.replies)

    def close(self) -> None:
        self.outbox.put(None)  # ends the requests; the server then ends the call
        for _ in self.replies:
            pass


def _bottom(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, EMBEDDING))


def _top() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2 * EMBEDDING, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def _inputs(seed: int) -> torch.Tensor:
    return torch.randn(SAMPLES, FEATURES, generator=torch.Generator().manual_seed(seed))


def _labels() -> torch.Tensor:
    return torch.randint(0, CLASSES, (SAMPLES,), generator=torch.Generator().manual_seed(3))


def _batch(step: int) -> torch.Tensor:
    return torch.arange(step * BATCH, (step + 1) * BATCH) % SAMPLES


def reference(steps: int) -> float:
    """Steps per second of the same steps in one process."""
    torch.set_num_threads(1)
    bottoms, top, labels = [_bottom(1), _bottom(2)], _top(), _labels()
    inputs = [_inputs(1), _inputs(2)]
    optimizers = [torch.optim.Adam(m.parameters(), 3e-3) for m in (*bottoms, top)]
    for step in range(WARMUP + steps):
        if step == WARMUP:
            start = time.perf_counter()
        rows = _batch(step)
        for opt in optimizers:
            opt.zero_grad()
        embeddings = [b(x[rows]) for b, x in zip(bottoms, inputs, strict=True)]
        nn.functional.cross_entropy(top(torch.cat(embeddings, 1)), labels[rows]).backward()
        for opt in optimizers:
            opt.step()
    return steps / (time.perf_counter() - start)


class _Turns:
    """Steps in order, one at a time: a step waits until the step before it is done."""

    def __init__(self) -> None:
        self.cond = threading.Condition()  # reentrant: waited on with the lock held, too
        self.done = -1  # the last step completed

    def wait_done(self, step: int) -> None:
        """Return once ``step`` is done."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.done >= step, timeout=JOIN_S):
                raise TimeoutError(f"step {step} did not complete within {JOIN_S:.0f} s")

    def complete(self, step: int) -> None:
        with self.cond:
            self.done = step
            self.cond.notify_all()


class _Active:
    """The top model: waits for both passive parties' embeddings of a step, then answers both."""

    def __init__(self) -> None:
        self.top, self.labels = _top(), _labels()
        self.optimizer = torch.optim.Adam(self.top.parameters(), 3e-3)
        self.turns = _Turns()
        self.embeddings: dict[int, torch.Tensor] = {}
        self.gradients: dict[int, bytes] = {}

    def exchange(self, request: bytes, context: Any = None) -> bytes:
        party, step = request[0], int.from_bytes(request[1:5], "little")
        _tapped(request, step)
        values = np.frombuffer(request, np.float32, offset=5).reshape(BATCH, EMBEDDING)
        with self.turns.cond:
            self.embeddings[party] = torch.from_numpy(values.copy()).requires_grad_()
            if len(self.embeddings) == 2:
                h = [self.embeddings[0], self.embeddings[1]]
                self.optimizer.zero_grad()
                loss = nn.functional.cross_entropy(self.top(torch.cat(h, 1)), self.labels[_batch(step)])
                loss.backward()
                self.optimizer.step()
                self.gradients = {p: h[p].grad.numpy().tobytes() for p in (0, 1)}  # type: ignore[union-attr]
                self.embeddings = {}
                self.turns.complete(step)
            else:
                self.turns.wait_done(step)  # the other passive party's embeddings complete it
            return _tapped(self.gradients[party], step)

    def run_step(self, request: bytes, context: Any = None) -> bytes:
        """The coordinator's command: answered once this party's part of the step is done."""
        step = int.from_bytes(request, "little")
        _tapped(request, step)
        self.turns.wait_done(step)
        return _tapped(request, step)


class _Passive:
    """A bottom model and its connection to the active party."""

    def __init__(self, active_port: int, party: int, streamed: bool) -> None:
        torch.set_num_threads(1)
        self.party = party
        self.bottom, self.inputs = _bottom(party + 1), _inputs(party + 1)
        self.optimizer = torch.optim.Adam(self.bottom.parameters(), 3e-3)
        self.turns = _Turns()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{active_port}")
        grpc.channel_ready_future(self.channel).result(timeout=JOIN_S)
        self.stream = _StreamCall(self.channel, f"/{SERVICE}/Stream") if streamed else None
        self.unary = self.channel.unary_unary(f"/{SERVICE}/Exchange")

    def call(self, request: bytes) -> bytes:
        if self.stream is not None:
            return self.stream.future(request).result()
        return self.unary(request, timeout=JOIN_S)

    def step(self, step: int) -> None:
        self.optimizer.zero_grad()
        h = self.bottom(self.inputs[_batch(step)])
        request = bytes([self.party]) + step.to_bytes(4, "little") + h.detach().numpy().tobytes()
        reply = _tapped(self.call(_tapped(request, step)), step)
        gradient = np.frombuffer(reply, np.float32).reshape(BATCH, EMBEDDING)
        h.backward(torch.from_numpy(gradient.copy()))
        self.optimizer.step()

    def run_step(self, request: bytes, context: Any = None) -> bytes:
        """The coordinator's command: this party's part of the step, in order."""
        step = int.from_bytes(request, "little")
        _tapped(request, step)
        self.turns.wait_done(step - 1)
        self.step(step)
        self.turns.complete(step)
        return _tapped(request, step)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.channel.close()


def _serve(service: str, methods: dict[str, grpc.RpcMethodHandler]) -> None:
    """Serve until the parent closes stdin (or dies); the port goes to stdout."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(grace=5).wait()


def serve_active() -> None:
    torch.set_num_threads(1)
    active = _Active()
    _serve(
        SERVICE,
        {
            "Exchange": grpc.unary_unary_rpc_method_handler(active.exchange),
            "Stream": _streamed(active.exchange),
            "RunStep": grpc.unary_unary_rpc_method_handler(active.run_step),
            "RunSteps": _streamed(active.run_step),
        },
    )


def serve_passive(active_port: int, party: int, mode: str) -> None:
    passive = _Passive(active_port, party, streamed=mode != "coordinated")
    _serve(
        PASSIVE_SERVICE,
        {
            "RunStep": grpc.unary_unary_rpc_method_handler(passive.run_step),
            "RunSteps": _streamed(passive.run_step),
        },
    )
    passive.close()


def run_passive(active_port: int, party: int, steps: int, mode: str) -> None:
    """A self-paced passive party: runs the steps, prints its steps per second (after the warm-up)."""
    passive = _Passive(active_port, party, streamed=mode == "stream")
    for step in range(WARMUP + steps):
        if step == WARMUP:
            start = time.perf_counter()
        passive.step(step)
    elapsed = time.perf_counter() - start
    passive.close()
    print(json.dumps({"steps_per_s": steps / elapsed}), flush=True)


def _coordinate(ports: dict[str, int], steps: int, streams: bool) -> list[float]:
    """Send every party a RunStep per step, two steps in flight (as vflnet's pipelined schedule); the
    time each step completed (``time.perf_counter``), warm-up steps included."""
    channels = {name: grpc.insecure_channel(f"127.0.0.1:{port}") for name, port in ports.items()}
    for ch in channels.values():
        grpc.channel_ready_future(ch).result(timeout=JOIN_S)
    calls: dict[str, Any] = {}
    for name, ch in channels.items():
        service = SERVICE if name == "active" else PASSIVE_SERVICE
        calls[name] = (
            _StreamCall(ch, f"/{service}/RunSteps") if streams else ch.unary_unary(f"/{service}/RunStep")
        )
    window: deque[list[Any]] = deque()
    sent = 0
    done: list[float] = []
    for step in range(WARMUP + steps):
        while sent <= step + 1 and sent < WARMUP + steps:  # this step and the next are out
            command = sent.to_bytes(4, "little")
            window.append([c.future(_tapped(command, sent), timeout=JOIN_S) for c in calls.values()])
            sent += 1
        for future in window.popleft():
            _tapped(future.result(), step)
        done.append(time.perf_counter())
    if streams:
        for call in calls.values():
            call.close()
    for ch in channels.values():
        ch.close()
    return done


def distributed(steps: int, mode: str, tap_dir: str | None = None) -> float:
    """Steps per second of the run: the slower passive party's, or the coordinator's. With ``tap_dir``
    every process appends each message it sends or receives to ``<tap_dir>/<its name>.trace``."""
    if mode in SELF_PACED:
        rate = _tapping(tap_dir, 0, lambda: _run(steps, mode, tap_dir, 0))
        assert isinstance(rate, float), mode  # a self-paced mode's run returns its rate
        return rate
    done = _coordinated(steps, mode, tap_dir, 0)
    return steps / (done[-1] - done[WARMUP - 1])


def tap_ab(steps: int, mode: str, tap_dir: str, blocks: int) -> list[tuple[int, float]]:
    """One run of a coordinated ``mode`` whose tap is on in even blocks of ``blocks`` steps and off in
    the odd ones: (step, seconds from the step before completing to this one completing), each timed
    step."""
    if mode in SELF_PACED:
        raise ValueError(f"an A/B of the tap times the steps at the coordinator: {mode!r} has none")
    done = _coordinated(steps, mode, tap_dir, blocks)
    return [(step, done[step] - done[step - 1]) for step in range(WARMUP, len(done))]


def _coordinated(steps: int, mode: str, tap_dir: str | None, blocks: int) -> list[float]:
    """The time each step of a coordinated run completed, warm-up steps included."""
    done = _tapping(tap_dir, blocks, lambda: _run(steps, mode, tap_dir, blocks))
    assert isinstance(done, list), mode  # a coordinated mode's run returns its steps' times
    return done


def _tapping(tap_dir: str | None, blocks: int, run: Callable[[], float | list[float]]) -> float | list[float]:
    """``run()``, this process (the coordinator) tapping too when there is a ``tap_dir``."""
    if tap_dir is None:
        return run()
    _open_tap(tap_dir, "coordinator", blocks)
    try:
        return run()
    finally:
        _close_tap()


def _run(steps: int, mode: str, tap_dir: str | None, blocks: int) -> float | list[float]:
    """The slower passive party's steps per second (self-paced modes), or the time each step completed
    at the coordinator, warm-up steps included."""
    tap = ["--tap-dir", tap_dir, "--tap-blocks", str(blocks)] if tap_dir else []
    me = [sys.executable, "-m", "vflnet.tools.bench.grpc_floor", *tap]
    servers: list[subprocess.Popen[str]] = []

    def serve(*args: str) -> int:
        servers.append(
            subprocess.Popen([*me, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
        return int(servers[-1].stdout.readline())  # type: ignore[union-attr]

    try:
        port = serve("--serve-active")
        if mode not in SELF_PACED:
            passives = {
                f"passive-{p}": serve(
                    "--serve-passive", "--port", str(port), "--party", str(p), "--mode", mode
                )
                for p in (0, 1)
            }
            return _coordinate({"active": port, **passives}, steps, streams=mode == "all-streams")
        args = ["--port", str(port), "--steps", str(steps), "--mode", mode]
        runs = [
            subprocess.Popen([*me, "--party", str(p), *args], stdout=subprocess.PIPE, text=True)
            for p in (0, 1)
        ]
        rates = []
        for p in runs:
            out, _ = p.communicate(timeout=JOIN_S + steps)  # far above any step time: a hang, not slowness
            if p.returncode != 0:
                raise RuntimeError(f"a passive party of the {mode} floor failed (exit {p.returncode})")
            rates.append(json.loads(out.splitlines()[-1])["steps_per_s"])
        return min(rates)
    finally:
        for server in reversed(servers):  # the passive parties first: they close their streams
            server.stdin.close()  # type: ignore[union-attr]
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet bench grpc-floor", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=1500, help="timed steps per run (after 20 warm-up steps)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each mode, alternating; the best is kept"
    )
    parser.add_argument("--serve-active", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-passive", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--party", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, some of {', '.join(MODES)}"
    )
    parser.add_argument(
        "--tap", action="store_true", help="also every mode with a bare trace tap in every process"
    )
    parser.add_argument("--mode", choices=MODES, default="unary", help=argparse.SUPPRESS)
    parser.add_argument("--tap-dir", help=argparse.SUPPRESS)
    parser.add_argument("--tap-blocks", type=int, default=0, help=argparse.SUPPRESS)
    args = parse_args(parser, argv, smoke={"steps": 30, "repeat": 1})
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; expected some of {list(MODES)}")
    if args.tap:
        modes = [v for m in modes for v in (m, m + TAP)]
    name = "active" if args.serve_active else f"passive-{args.party}"
    _open_tap(args.tap_dir, name, args.tap_blocks)
    if args.serve_active:
        serve_active()
        return 0
    if args.serve_passive:
        serve_passive(args.port, args.party, args.mode)
        return 0
    if args.party is not None:
        run_passive(args.port, args.party, args.steps, args.mode)
        return 0
    best: dict[str, float] = {}
    with progress.runs("bench grpc-floor", total=args.repeat * (1 + len(modes))):
        for i in range(args.repeat):
            for mode in ("reference", *modes):
                if mode == "reference":
                    rate = reference(args.steps)
                else:
                    with scratch("vflnet-floor-") as directory:
                        tap_dir = str(directory) if mode.endswith(TAP) else None
                        rate = distributed(args.steps, mode.removesuffix(TAP), tap_dir)
                best[mode] = max(best.get(mode, 0.0), rate)
                progress.advance(f"run {i + 1} {mode}")
                progress.note(f"  run {i + 1} of {args.repeat}, {mode}: {rate:.1f} steps/s")
    ref = best["reference"]
    rows: list[Row] = [
        {
            "mode": mode,
            "steps_per_s": round(best[mode], 1),
            "ratio_to_reference": round(best[mode] / ref, 3),
            "overhead_ms": round(1000 / best[mode] - 1000 / ref, 2),
        }
        for mode in ("reference", *modes)
    ]
    print()
    print(markdown_table(rows))
    print(
        "\nbare Python gRPC: unary and stream = 3 self-paced processes, 2 calls per step or 2 streams per"
        " run; coordinated = + a RunStep to every party per step, 2 steps in flight; coordinated-stream ="
        " coordinated with the exchanges on a stream per passive party; all-streams = the RunSteps on a"
        " stream per party too; +tap = every message appended to a file in every process. Best of"
        " --repeat runs; compare with `vflnet bench transport --case digits-mlp-b256`"
    )
    write_json(args.json, rows, steps=args.steps, repeat=args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
