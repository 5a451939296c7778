"""A userspace Ethernet hub with delay and loss, for kernels built without ``sch_netem``.

It runs inside the lab's switch namespace, in place of the kernel bridge. Each port is the switch
end of one host's veth pair. A frame that arrives on a port is dropped with the loss probability
or held for the delay, which is what ``tc netem`` on that host's egress would do. Then it leaves
through the port that last sent from the destination MAC, or through every other port when the
destination is unknown or a broadcast. ``PACKET_VNET_HDR`` carries GSO super-packets and partial
checksums across the hop unchanged, as the kernel bridge does.
"""

from __future__ import annotations

import argparse
import heapq
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
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}


@dataclass(frozen=True)
class Impairment:
    delay_s: float = 0.0
    loss: float = 0.0  # probability that a frame is dropped


def _parse_time(text: str) -> float:
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


def parse_netem(spec: str) -> Impairment:
    """The part of tc-netem's syntax this hub can emulate: ``delay TIME`` and ``loss PERCENT%``."""
    tokens = spec.split()
    delay = loss = 0.0
    i = 0
    while i < len(tokens):
        option = tokens[i]
        if option not in ("delay", "loss") or i + 1 >= len(tokens):
            raise ValueError(
                f"netem option {option!r} in {spec!r} is not emulated in userspace; "
                "use 'delay TIME' and 'loss PERCENT%', or a kernel with sch_netem"
            )
        if option == "delay":
            delay = _parse_time(tokens[i + 1])
        else:
            loss = _parse_percent(tokens[i + 1])
        i += 2
    return Impairment(delay_s=delay, loss=loss)


def _open_port(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((name, 0))
    sock.setblocking(False)
    return sock


class Hub:
    """Frames in, impaired frames out; the delay queue is a heap keyed by due time and arrival order."""

    def __init__(self, ports: list[str], impairment: Impairment, seed: int) -> None:
        self.impairment = impairment
        self.rng = random.Random(seed)
        self.socks = [_open_port(p) for p in ports]
        self.macs: dict[bytes, socket.socket] = {}
        self.queue: list[tuple[float, int, bytes, list[socket.socket]]] = []
        self.seq = 0
        self.selector = selectors.DefaultSelector()
        for sock in self.socks:
            self.selector.register(sock, selectors.EVENT_READ)

    def _receive(self, sock: socket.socket) -> None:
        while True:
            try:
                data, addr = sock.recvfrom(MAX_FRAME)
            except BlockingIOError:
                return
            except OSError:  # the veth went away with its host's namespace: the port is gone
                self._close(sock)
                return
            if addr[2] == PACKET_OUTGOING or len(data) < VNET_HDR_LEN + 14:
                continue
            dst = data[VNET_HDR_LEN : VNET_HDR_LEN + 6]
            self.macs[data[VNET_HDR_LEN + 6 : VNET_HDR_LEN + 12]] = sock
            if self.impairment.loss and self.rng.random() < self.impairment.loss:
                continue
            out = self.macs.get(dst)
            targets = (
                [out] if out is not None and not dst[0] & 1 else [s for s in self.socks if s is not sock]
            )
            self.seq += 1
            heapq.heappush(self.queue, (time.monotonic() + self.impairment.delay_s, self.seq, data, targets))

    def _close(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        self.socks.remove(sock)
        self.macs = {mac: s for mac, s in self.macs.items() if s is not sock}
        self.queue = [
            (due, seq, data, [s for s in targets if s is not sock]) for due, seq, data, targets in self.queue
        ]
        heapq.heapify(self.queue)
        sock.close()

    def _send_due(self) -> None:
        now = time.monotonic()
        while self.queue and self.queue[0][0] <= now:
            _, _, data, targets = heapq.heappop(self.queue)
            for sock in targets:
                try:
                    sock.send(data)
                except OSError:
                    pass  # a full queue or a host that went away loses the frame, as a real link would

    def serve_forever(self) -> None:
        """Forward until every port is gone (the lab was torn down) or the process is signalled."""
        while self.socks:
            timeout = max(0.0, self.queue[0][0] - time.monotonic()) if self.queue else None
            for key, _ in self.selector.select(timeout):
                self._receive(key.fileobj)  # type: ignore[arg-type]
            self._send_due()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vflnet.tools.lab.switch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("ports", nargs="+", help="switch-side veth names")
    parser.add_argument("--netem", default="", help="impairment, e.g. 'delay 100ms loss 1%%'")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss draws")
    parser.add_argument("--ready-file", type=Path, default=None, help="written once every port is open")
    args = parser.parse_args(argv)
    hub = Hub(args.ports, parse_netem(args.netem), args.seed)
    if args.ready_file is not None:
        args.ready_file.write_text("ready\n")
    print(f"hub on {', '.join(args.ports)}: {hub.impairment}", file=sys.stderr, flush=True)
    hub.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
