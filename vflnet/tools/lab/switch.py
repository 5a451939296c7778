"""A userspace Ethernet hub with per-host delay, jitter, loss, rate and link state, for kernels
built without ``sch_netem`` and for faults injected while a run goes on.

It runs inside the lab's switch namespace, in place of the kernel bridge. Each port is the switch
end of one host's veth pair. A frame that arrives on a port is shaped by that host's impairment,
which is what ``tc netem`` on the host's egress would do: dropped with the loss probability, held
while the host's link sends what it already holds at its rate, then for the delay plus a uniform
draw within the jitter (never before the frame the host sent before it: jitter here does not
reorder). Then it leaves through the port that last sent from the destination MAC, or through
every other port when the destination is unknown or a broadcast. A port that is down drops every
frame from it and to it, including those already held: a cut cable. ``PACKET_VNET_HDR`` carries
GSO super-packets and partial checksums across the hop unchanged, as the kernel bridge does.

A Unix socket (``--control``) changes a port's impairment or link state while frames flow: one
line in (``p2 delay=20ms jitter=5ms``, ``p2 down``, ``p2 up``, ``p2 clear``, ``show``), one JSON
line out with every port's state. ``vflnet lab impair`` and ``vflnet lab run --fault`` speak it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import selectors
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4  # sll_pkttype of a frame this host sent: a copy, not traffic to forward
VNET_HDR_LEN = 10  # struct virtio_net_hdr
MAX_FRAME = 1 << 18  # a GSO super-packet on a veth is at most 64 KiB plus headers
QUEUE_LIMIT = 1000  # frames one port may have held at once (tc netem's default limit)
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}  # SI, as tc reads them
LINK_STATES = ("down", "up")


@dataclass(frozen=True)
class Impairment:
    delay_s: float = 0.0
    loss: float = 0.0  # probability that a frame is dropped
    jitter_s: float = 0.0  # the delay varies uniformly within +- this
    rate_bps: float = 0.0  # bits per second the host's link sends at (0: unlimited)

    def spec(self) -> str:
        """The impairment in ``vflnet lab impair``'s syntax (``clear`` when there is none)."""
        parts = [
            f"delay={self.delay_s * 1e3:g}ms" if self.delay_s else "",
            f"jitter={self.jitter_s * 1e3:g}ms" if self.jitter_s else "",
            f"loss={self.loss * 100:g}%" if self.loss else "",
            f"rate={_rate_text(self.rate_bps)}" if self.rate_bps else "",
        ]
        return " ".join(p for p in parts if p) or "clear"


def _rate_text(bps: float) -> str:
    unit = next(u for u in ("gbit", "mbit", "kbit", "bit") if bps >= _RATE_UNITS[u] or u == "bit")
    return f"{bps / _RATE_UNITS[unit]:g}{unit}"


def parse_time(text: str) -> float:
    for unit in sorted(_TIME_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            number = text[: -len(unit)]
            try:
                value = float(number) * _TIME_UNITS[unit]
            except ValueError:
                break
            if value < 0:
                break
            return value
    raise ValueError(f"bad time {text!r}: expected a number with us, ms or s (e.g. 100ms)")


def _parse_percent(text: str) -> float:
    try:
        value = float(text.removesuffix("%")) / 100
    except ValueError:
        value = -1.0
    if not text.endswith("%") or not 0 <= value <= 1:
        raise ValueError(f"bad loss {text!r}: expected a percentage between 0% and 100% (e.g. 1%)")
    return value


def _parse_rate(text: str) -> float:
    for unit in sorted(_RATE_UNITS, key=len, reverse=True):
        if text.lower().endswith(unit):
            try:
                value = float(text[: -len(unit)]) * _RATE_UNITS[unit]
            except ValueError:
                break
            if value <= 0:
                break
            return value
    raise ValueError(
        f"bad rate {text!r}: expected a positive number with bit, kbit, mbit or gbit (e.g. 10mbit)"
    )


def parse_netem(spec: str) -> Impairment:
    """The part of tc-netem's syntax this hub can emulate: ``delay TIME [JITTER]``, ``loss
    PERCENT%`` and ``rate RATE``."""
    tokens = spec.split()
    values: dict[str, float] = {}
    i = 0
    while i < len(tokens):
        option = tokens[i]
        if option not in ("delay", "loss", "rate") or i + 1 >= len(tokens):
            raise ValueError(
                f"netem option {option!r} in {spec!r} is not emulated in userspace; "
                "use 'delay TIME [JITTER]', 'loss PERCENT%' and 'rate RATE', or a kernel with sch_netem"
            )
        if option == "delay":
            values["delay_s"] = parse_time(tokens[i + 1])
            if i + 2 < len(tokens) and tokens[i + 2][:1].isdigit():
                values["jitter_s"] = parse_time(tokens[i + 2])
                i += 1
        elif option == "loss":
            values["loss"] = _parse_percent(tokens[i + 1])
        else:
            values["rate_bps"] = _parse_rate(tokens[i + 1])
        i += 2
    return Impairment(**values)


_IMPAIR_KEYS = {"delay": ("delay_s", parse_time), "jitter": ("jitter_s", parse_time)}
_IMPAIR_KEYS.update(loss=("loss", _parse_percent), rate=("rate_bps", _parse_rate))


def parse_impair(tokens: list[str]) -> Impairment | str:
    """``vflnet lab impair``'s settings: ``down``, ``up``, ``clear`` (no impairment), or
    ``KEY=VALUE`` for delay, jitter, loss and rate (the keys not given are none)."""
    if len(tokens) == 1 and tokens[0] in (*LINK_STATES, "clear"):
        return Impairment() if tokens[0] == "clear" else tokens[0]
    if not tokens:
        raise ValueError("no setting: expected down, up, clear, or KEY=VALUE with delay, jitter, loss, rate")
    values: dict[str, float] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or key not in _IMPAIR_KEYS:
            raise ValueError(
                f"setting {token!r}: expected down, up, clear (each alone), or KEY=VALUE with "
                "delay, jitter, loss, rate (e.g. delay=20ms jitter=5ms loss=1% rate=10mbit)"
            )
        if _IMPAIR_KEYS[key][0] in values:
            raise ValueError(f"setting {key!r} is given twice")
        values[_IMPAIR_KEYS[key][0]] = _IMPAIR_KEYS[key][1](value)
    return Impairment(**values)


@dataclass
class Port:
    """One host's link: its impairment and state, and what its frames hold of the link."""

    name: str
    sock: socket.socket
    impairment: Impairment
    up: bool = True
    busy_until: float = 0.0  # when the link has sent, at its rate, what it already holds
    last_due: float = 0.0  # jitter never sends a frame before the one this host sent before it
    queued: int = 0

    def due(self, now: float, length: int, rng: random.Random) -> float | None:
        """When a frame of ``length`` bytes this host sends at ``now`` leaves the hub; None: lost."""
        imp = self.impairment
        if not self.up or self.queued >= QUEUE_LIMIT or (imp.loss and rng.random() < imp.loss):
            return None
        sent = now
        if imp.rate_bps:
            sent = max(now, self.busy_until) + length * 8 / imp.rate_bps
            self.busy_until = sent
        jitter = rng.uniform(-imp.jitter_s, imp.jitter_s) if imp.jitter_s else 0.0
        self.last_due = max(sent + imp.delay_s + jitter, sent, self.last_due)
        return self.last_due

    def state(self) -> dict[str, object]:
        return {"up": self.up, "impairment": self.impairment.spec()}


def _open_port(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((name, 0))
    sock.setblocking(False)
    return sock


class Hub:
    """Frames in, impaired frames out; the delay queue is a heap keyed by due time and arrival order."""

    def __init__(
        self, ports: list[str], impairment: Impairment, seed: int, control: Path | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.ports = {name: Port(name, _open_port(name), impairment) for name in ports}
        self.by_sock = {port.sock: port for port in self.ports.values()}
        self.macs: dict[bytes, Port] = {}
        self.queue: list[tuple[float, int, bytes, Port, list[Port]]] = []
        self.seq = 0
        self.selector = selectors.DefaultSelector()
        for port in self.ports.values():
            self.selector.register(port.sock, selectors.EVENT_READ)
        self.control: socket.socket | None = None
        if control is not None:
            control.unlink(missing_ok=True)
            self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.control.bind(str(control))
            os.chmod(control, 0o600)
            self.control.listen(8)
            self.selector.register(self.control, selectors.EVENT_READ)

    def _receive(self, port: Port) -> None:
        while True:
            try:
                data, addr = port.sock.recvfrom(MAX_FRAME)
            except BlockingIOError:
                return
            except OSError:
                # ENETDOWN while a veth end is down is a state the link comes back from; only a
                # veth gone with its host's namespace ends the port
                if not _exists(port.name):
                    self._close(port)
                return
            if addr[2] == PACKET_OUTGOING or len(data) < VNET_HDR_LEN + 14:
                continue
            dst = data[VNET_HDR_LEN : VNET_HDR_LEN + 6]
            self.macs[data[VNET_HDR_LEN + 6 : VNET_HDR_LEN + 12]] = port
            due = port.due(time.monotonic(), len(data) - VNET_HDR_LEN, self.rng)
            if due is None:
                continue
            out = self.macs.get(dst)
            targets = (
                [out]
                if out is not None and not dst[0] & 1
                else [p for p in self.ports.values() if p is not port]
            )
            self.seq += 1
            port.queued += 1
            heapq.heappush(self.queue, (due, self.seq, data, port, targets))

    def _close(self, port: Port) -> None:
        self.selector.unregister(port.sock)
        del self.ports[port.name], self.by_sock[port.sock]
        self.macs = {mac: p for mac, p in self.macs.items() if p is not port}
        self.queue = [
            (due, seq, data, src, [p for p in targets if p is not port])
            for due, seq, data, src, targets in self.queue
        ]
        heapq.heapify(self.queue)
        port.sock.close()

    def _send_due(self) -> None:
        now = time.monotonic()
        while self.queue and self.queue[0][0] <= now:
            _, _, data, src, targets = heapq.heappop(self.queue)
            src.queued -= 1
            if not src.up:
                continue  # cut while it was on the wire
            for port in targets:
                if not port.up:
                    continue
                try:
                    port.sock.send(data)
                except OSError:
                    pass  # a full queue or a host that went away loses the frame, as a real link would

    def command(self, line: str) -> dict[str, object]:
        """``PORT SETTING...`` (see parse_impair) or ``show``: every port's state after it."""
        tokens = line.split()
        if tokens != ["show"]:
            if not tokens or tokens[0] not in self.ports:
                raise ValueError(f"no port {tokens[0] if tokens else ''!r} (ports: {', '.join(self.ports)})")
            port = self.ports[tokens[0]]
            setting = parse_impair(tokens[1:])
            if isinstance(setting, Impairment):
                port.impairment = setting
                port.busy_until = port.last_due = 0.0
            else:
                port.up = setting == "up"
            print(f"{time.time():.3f} {port.name}: {' '.join(tokens[1:])}", file=sys.stderr, flush=True)
        return {"ok": True, "ports": {name: port.state() for name, port in self.ports.items()}}

    def _serve_control(self, control: socket.socket) -> None:
        conn, _ = control.accept()
        with conn:
            conn.settimeout(5.0)  # a client sends its one line at once; a stuck one must not stop the hub
            try:
                data = b""
                while not data.endswith(b"\n") and len(data) < 4096:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                try:
                    reply = self.command(data.decode(errors="replace").strip())
                except ValueError as exc:
                    reply = {"ok": False, "error": str(exc)}
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass  # the client went away: nothing was changed it would not know about

    def serve_forever(self) -> None:
        """Forward until every port is gone (the lab was torn down) or the process is signalled."""
        while self.ports:
            timeout = max(0.0, self.queue[0][0] - time.monotonic()) if self.queue else None
            for key, _ in self.selector.select(timeout):
                if key.fileobj is self.control:
                    self._serve_control(self.control)
                else:
                    self._receive(self.by_sock[key.fileobj])  # type: ignore[index]
            self._send_due()


def _exists(interface: str) -> bool:
    try:
        socket.if_nametoindex(interface)
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vflnet.tools.lab.switch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("ports", nargs="+", help="switch-side veth names")
    parser.add_argument(
        "--netem", default="", help="every port's impairment at start, e.g. 'delay 100ms 10ms loss 1%%'"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter draws")
    parser.add_argument("--ready-file", type=Path, default=None, help="written once every port is open")
    parser.add_argument("--control", type=Path, default=None, help="Unix socket for changes while running")
    args = parser.parse_args(argv)
    hub = Hub(args.ports, parse_netem(args.netem), args.seed, args.control)
    if args.ready_file is not None:
        args.ready_file.write_text("ready\n")
    print(f"hub on {', '.join(args.ports)}: {parse_netem(args.netem).spec()}", file=sys.stderr, flush=True)
    hub.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
