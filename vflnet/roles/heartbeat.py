"""Heartbeats: slow is not dead.

A party health-checks the coordinator, and the coordinator every party, every
``transport.heartbeat_s`` with the standard gRPC health service each vflnet server runs
(vflnet/wire/channels.py). The health service answers on its own server thread, so a peer busy with
a long step still answers; a peer that answers nothing for ``transport.dead_after_s`` (killed,
stopped, its host gone) is dead:

- a party stops (exit code 3, as when the coordinator goes silent for ``idle_timeout_s``);
- the coordinator fails the run naming the party, at once rather than when the step's
  deadline runs out (vflnet/sdk/deadlines.py): :class:`Abort` cancels the calls the schedule waits on.

Heartbeats travel on their own channels with an empty mod chain: the same TLS identity checks as
every channel of the process, but a trace tap or an attack never sees them. They run only on real
gRPC (``GrpcBridge``): on the loopback bridge every role is a thread of one process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vflnet.config import Config, TransportConfig
from vflnet.interceptors.chain import Chain
from vflnet.sdk.bridge import Bridge, GrpcBridge
from vflnet.sdk.contract import RunFailed
from vflnet.v1 import messages_pb2
from vflnet.wire.errors import describe_rpc_error

if TYPE_CHECKING:
    from vflnet.roles.common import Liveness

log = logging.getLogger("vflnet.heartbeat")

# how far past its deadline a failed check must end to show that this process itself was paused
PAUSED_SLACK_S = 2.0

Check = Callable[[float], None]  # one health check with this timeout; raises HeartbeatError on failure


class HeartbeatError(Exception):
    pass


def enabled(transport: TransportConfig, bridge: Bridge) -> bool:
    return transport.heartbeat_s > 0 and isinstance(bridge, GrpcBridge)


def health_check(channel: grpc.Channel) -> Check:
    """A check of the whole server behind ``channel``: SERVING, or HeartbeatError saying why not."""
    stub = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING

    def check(timeout: float) -> None:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError as exc:
            raise HeartbeatError(describe_rpc_error(exc)) from exc
        if reply.status != serving:
            raise HeartbeatError(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    return check


class Heartbeat:
    """Runs ``check`` every ``every_s`` on a daemon thread. Once every check for ``dead_after_s`` has
    failed, calls ``on_dead(silent_s, last_error)`` once and stops; one answer resets the count."""

    def __init__(
        self,
        name: str,
        check: Check,
        every_s: float,
        dead_after_s: float,
        on_dead: Callable[[float, str], None],
    ) -> None:
        self.check, self.every_s, self.dead_after_s, self.on_dead = check, every_s, dead_after_s, on_dead
        # a check may take a while on a loaded machine; only one that says nothing this long fails
        self.check_timeout_s = max(every_s, min(dead_after_s / 4, 10.0))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.check(self.check_timeout_s)
                last_ok = time.monotonic()
            except HeartbeatError as exc:
                ended = time.monotonic()
                if ended - began > self.check_timeout_s + PAUSED_SLACK_S:
                    # a check outlived its own deadline: this process was stopped or starved, so the
                    # silence was ours, not the peer's; count afresh
                    last_ok = ended
                elif ended - last_ok >= self.dead_after_s and not self._stop.is_set():
                    self.on_dead(ended - last_ok, str(exc))
                    return
            done = time.monotonic()
            self._stop.wait(max(0.0, self.every_s - (done - began)))
            if time.monotonic() - done > self.every_s + PAUSED_SLACK_S:
                last_ok = time.monotonic()  # paused between two checks: that silence was ours too


# ---------------------------------------------------------------------------------- party side
def watch_coordinator(
    cfg: Config, name: str, bridge: Bridge, liveness: Liveness, address: str
) -> Heartbeat | None:
    """Start health-checking the coordinator at ``address`` for party ``name`` (after its join); when
    the coordinator is dead, ``liveness`` ends with the reason, and the party exits (code 3)."""
    transport = cfg.transport
    if not enabled(transport, bridge):
        return None
    channel = bridge.open_channel(address, name, Chain(), cfg.coordinator.name)

    def dead(silent_s: float, error: str) -> None:
        log.error(
            "%s: coordinator %s unreachable for %.0f s: stopping (last error: %s)",
            name,
            address,
            silent_s,
            error,
        )
        liveness.stop(f"coordinator {address} unreachable for {silent_s:.0f} s (last error: {error})")

    return Heartbeat(
        cfg.coordinator.name, health_check(channel), transport.heartbeat_s, transport.dead_after_s, dead
    ).start()


# ---------------------------------------------------------------------------- coordinator side
class Abort:
    """How a watcher ends the schedule's wait for its calls: it records why and cancels the calls in
    flight, whose done-callbacks wake ``Schedule._all``; there ``check`` raises RunFailed(why)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[grpc.Future] = []
        self.why: str | None = None

    def track(self, calls: Iterable[Any]) -> None:
        """The calls the schedule now waits on (their done-callbacks already added)."""
        with self._lock:
            self._calls = list(calls)
            late = self.why is not None
        if late:  # aborted between two waits: end this one at once
            for call in self._calls:
                call.cancel()

    def fire(self, why: str) -> None:
        with self._lock:
            if self.why is not None:
                return
            self.why = why
            calls = list(self._calls)
        for call in calls:
            call.cancel()

    def check(self) -> None:
        if self.why is not None:
            raise RunFailed(self.why)


class PartyWatch:
    """The coordinator's heartbeats to every party while the schedule runs."""

    def __init__(self, transport: TransportConfig, bridge: Bridge, name: str) -> None:
        self.transport, self.bridge, self.name = transport, bridge, name
        self.dead: set[str] = set()

    @contextmanager
    def watching(self, roster: Iterable[messages_pb2.PartyInfo], abort: Abort) -> Iterator[None]:
        if not enabled(self.transport, self.bridge):
            yield
            return
        beats, channels = [], []
        for info in roster:
            channel = self.bridge.open_channel(info.address, self.name, Chain(), info.name)
            channels.append(channel)
            beats.append(
                Heartbeat(
                    info.name,
                    health_check(channel),
                    self.transport.heartbeat_s,
                    self.transport.dead_after_s,
                    self._on_dead(info.name, abort),
                ).start()
            )
        try:
            yield
        finally:
            for beat in beats:
                beat.stop()
            for channel in channels:
                channel.close()

    def _on_dead(self, party: str, abort: Abort) -> Callable[[float, str], None]:
        def dead(silent_s: float, error: str) -> None:
            self.dead.add(party)
            why = (
                f"party {party!r} has not answered heartbeats for {silent_s:.0f} s "
                f"(transport.dead_after_s: {self.transport.dead_after_s:g}; last error: {error})"
            )
            log.error("%s", why)
            abort.fire(why)

        return dead

    def alive(self, stubs: dict[str, Any]) -> dict[str, Any]:
        """``stubs`` less the parties found dead (a Shutdown to those would only wait out its deadline)."""
        return {name: stub for name, stub in stubs.items() if name not in self.dead}
