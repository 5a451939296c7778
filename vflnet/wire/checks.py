"""The checks the host makes on every message before a protocol sees it, and the header it stamps.

A message must belong to this run (``check_run``) and come from a roster party whose role may call the
method, the certificate's identity under mutual TLS (``check_sender``). Handlers registered with
``vflnet.sdk.handles`` get both from the host; the hosts' own services call them directly.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc

from vflnet.config import Config
from vflnet.v1 import messages_pb2
from vflnet.wire.errors import RpcFailure, permission_denied, shown

ANSWER_MARGIN_S = 2.0  # a waiting call is answered this long (or half its time left) before its deadline


def header(
    cfg: Config, sender: str, step: int, epoch: int, batch_id: int, phase: int, version: int
) -> messages_pb2.Header:
    return messages_pb2.Header(
        run_id=cfg.run.id,
        step=step,
        epoch=epoch,
        batch_id=batch_id,
        phase=phase,
        sender=sender,
        model_version=version,
    )


def check_run(cfg: Config, got: str) -> None:
    if got != cfg.run.id:
        raise permission_denied(f"message for run {shown(got)}, this is run {cfg.run.id!r}")


def check_sender(cfg: Config, sender: str, roles: set[str], context: grpc.ServicerContext | None) -> None:
    """The sender must be in the roster with an allowed role; under TLS it must also be the
    certificate's identity (a party cannot speak for another)."""
    role = next((p.role for p in cfg.parties if p.name == sender), None)
    if role is None:
        raise permission_denied(f"unknown party {shown(sender)}: not in the roster")
    if role not in roles:
        raise permission_denied(f"party {sender!r} has role {role!r}; this call needs {sorted(roles)}")
    if cfg.transport.tls.enabled and context is not None:
        from vflnet.wire.tls import peer_identity

        ident = peer_identity(context)
        if ident is None or ident.name != sender:
            raise permission_denied(
                f"header says {sender!r} but the certificate says {ident.name if ident else None!r}"
            )


class JoinWaitroom:
    """Where a message that arrives before this party has finished joining waits (a peer admitted a
    moment earlier may send its first step first). Callers check everything that needs no admission
    before they wait here; at most ``per_sender`` messages of each sender wait at once, and each is
    answered with a status before its caller's deadline: nothing the server holds ends in
    DEADLINE_EXCEEDED."""

    def __init__(self, ready: threading.Event, name: str, per_sender: int) -> None:
        self.ready, self.name, self.per_sender = ready, name, per_sender
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}

    def wait(self, sender: str, context: Any, limit_s: float) -> None:
        """Return once this party is ready; ``sender`` is a roster name (checked by the caller)."""
        if self.ready.is_set():
            return
        with self._lock:
            if self._waiting.get(sender, 0) >= self.per_sender:
                raise RpcFailure(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{shown(sender)} has {self.per_sender} message(s) waiting for {self.name} to finish "
                    "joining already",
                )
            self._waiting[sender] = self._waiting.get(sender, 0) + 1
        try:
            wait_s = limit_s
            remaining = context.time_remaining() if context is not None else None
            if remaining is not None:  # keep time to send the answer back before the caller gives up
                wait_s = min(wait_s, remaining - min(ANSWER_MARGIN_S, remaining / 2))
            if not self.ready.wait(max(0.0, wait_s)):
                raise RpcFailure(
                    grpc.StatusCode.UNAVAILABLE,
                    f"{self.name} has not finished joining after {wait_s:.1f} s; send it again later",
                )
        finally:
            with self._lock:
                self._waiting[sender] -= 1
