"""The lab's tampering adversary: ``vflnet proxy`` that also changes what it relays.

It is built from :mod:`vflnet.roles.proxy` and adds one tamper per mode:

- ``--mode grpc``: every ``ExchangeEmbeddings`` request is rewritten so that its embeddings arrive
  as zeros. Over plaintext the run still completes, but it trains on what the proxy chose, so its
  result differs from an honest run. The trace records the embeddings as they were sent.
- ``--mode tcp``: one bit is flipped in each client-to-upstream connection once ``--flip-after``
  bytes have passed. Under TLS that bit fails the record's authentication, so the connection and
  the call on it fail. Nothing altered is ever delivered.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from google.protobuf.message import Message

from vflnet.config import TransportConfig
from vflnet.interceptors.chain import Chain, Filter, Mod
from vflnet.interceptors.events import WireEvent
from vflnet.interceptors.trace import TraceWriter
from vflnet.roles.proxy import ByteMod, StopSignals, TcpRelay, run_proxy, serve_until_signal
from vflnet.validation import load_config
from vflnet.wire import tensors

log = logging.getLogger("vflnet.tools.lab.mitm")


def zero_embeddings(event: WireEvent) -> Message | None:
    """A rewrite: the same Embeddings message with its plaintext values (a top-level ``values``
    field) set to 0."""
    protos = event.tensor_protos()
    if not protos:
        return None  # encrypted (split-he) embeddings: nothing this proxy can read or zero
    out = type(event.message)()
    out.CopyFrom(event.message)
    for path, proto in protos.items():
        zeros = np.zeros_like(tensors.from_proto(proto, require_finite=False))
        getattr(out, path).CopyFrom(tensors.to_proto(zeros))
    log.info("zeroed %s from %s", ", ".join(protos), event.sender)
    return out


def bit_flipper(after_bytes: int) -> Callable[[], ByteMod]:
    """A TcpRelay rewrite factory: each connection's rewrite flips the lowest bit of the first
    client-to-upstream byte at or past ``after_bytes``."""

    def for_connection() -> ByteMod:
        passed = 0

        def rewrite(chunk: bytes, direction: str) -> bytes:
            nonlocal passed
            if direction != "up":
                return chunk
            start, passed = passed, passed + len(chunk)
            if not start <= after_bytes < passed:
                return chunk
            i = after_bytes - start
            log.info("flipped one bit at byte %d of a connection", after_bytes)
            return chunk[:i] + bytes([chunk[i] ^ 1]) + chunk[i + 1 :]

        return rewrite

    return for_connection


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vflnet.tools.lab.mitm", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the party to forward to")
    parser.add_argument("--mode", choices=["grpc", "tcp"], default="grpc")
    parser.add_argument("--trace", type=Path, help="grpc mode: record every message (before tampering)")
    parser.add_argument("--config", type=Path, help="run config: message size limits and the run id")
    parser.add_argument(
        "--flip-after", type=int, default=4096, help="tcp mode: byte offset of the flipped bit"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s mitm %(levelname)s %(name)s: %(message)s")
    stop = StopSignals()
    if args.mode == "tcp":
        relay = TcpRelay(args.listen, args.upstream, rewrite=bit_flipper(args.flip_after))
        port = relay.start()
        print(f"tampering tcp relay on port {port} -> {args.upstream}", flush=True)
        stop.wait()
        relay.stop()
        s = relay.stats
        print(
            f"relayed {s.connections} connections, {s.bytes_up} B up, {s.bytes_down} B down, "
            f"{s.messages_seen} vflnet messages seen",
            flush=True,
        )
        return 0
    transport, run_id = TransportConfig(), ""
    if args.config:
        cfg = load_config(args.config)
        transport, run_id = cfg.transport, cfg.run.id
    mods: list[Mod] = []
    writer = TraceWriter(args.trace, party="proxy", run_id=run_id) if args.trace else None
    if writer is not None:
        mods.append(writer)
    mods.append(Filter(zero_embeddings, methods=["ExchangeEmbeddings"], directions=["request"]))
    server, port = run_proxy(args.listen, args.upstream, Chain(mods), transport, name="proxy")
    print(f"tampering grpc proxy on port {port} -> {args.upstream}", flush=True)
    serve_until_signal(server, writer, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
