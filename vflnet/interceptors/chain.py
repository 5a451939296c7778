"""Mods and the chain that runs them: the whole contract of a tap, a rewrite or a refusal.

A mod is any callable ``mod(event: WireEvent) -> Message | None``:

- a **tap** records ``event`` and returns None (the message goes on unchanged);
- a **rewrite** returns a new message of the same type; it replaces the one that goes on the wire
  and is what later mods see;
- a mod **refuses** a message by raising :class:`Refused`; the adapters turn that into a gRPC status
  on the call, so one refused message fails one call and the process keeps serving.

List order is execution order, as in Flower's mods. The chain knows nothing about gRPC; the adapters
in ``grpc_adapters`` and the proxy bind it to the wire.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Sequence

import grpc
from google.protobuf.message import Message

from vflnet.interceptors.events import DIRECTIONS, SIDES, WireEvent, WireRecord, short_name

Mod = Callable[[WireEvent], Message | None]


class Refused(Exception):
    """Raised by a mod to stop a message; the call fails with ``code`` and the reason as details."""

    def __init__(self, reason: str, code: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class Recorder(abc.ABC):
    """A tap that only records what crosses the wire: the trace tap. ``record`` must not rewrite or
    refuse (raise :class:`Refused`). Alone in a chain, it is run without an event per message: the
    hooks (``grpc_adapters``) hand ``record`` the message's :class:`WireRecord`, stamped when seen (a
    traced digits run's step: 0.09 ms less than building an event and running the chain,
    docs/performance.md, "Design decisions"). In any other chain it is a mod like any other."""

    @abc.abstractmethod
    def record(self, record: WireRecord) -> None:
        """Record one message."""

    def __call__(self, event: WireEvent) -> None:
        self.record(event.as_record())


# A chain gate: a predicate over a party's messages; a message it lets by passes the party's chain
# untouched, before any event is built (no tap, trace or attack sees it). A plug-in module brings one
# (:func:`gate_chains`), and it gates the chains of the runs whose config lists that module under
# ``plugins:`` (`vflnet bench goals` times the trace tap inside one run so:
# vflnet/tools/bench/tap_ab.py). The config checks refuse it beside an attack, and in a run whose
# chains are all empty (vflnet/validation.py).
ChainGate = Callable[[Message], bool]
CHAIN_GATES: dict[str, ChainGate] = {}  # plug-in module -> its gate


def gate_chains(module: str, gate: ChainGate) -> None:
    """Called by plug-in ``module`` when imported: its runs' chains let by what ``gate`` says."""
    CHAIN_GATES[module] = gate


def chain_gate(plugins: Iterable[str]) -> tuple[str, ChainGate] | None:
    """The gate of a run whose config lists ``plugins`` (imported), with its module; None without."""
    gates = [(module, CHAIN_GATES[module]) for module in plugins if module in CHAIN_GATES]
    if len(gates) > 1:
        raise ValueError(f"plug-ins {[m for m, _ in gates]} each gate the chains; a run takes one at most")
    return gates[0] if gates else None


class Chain:
    """Runs mods in list order, each seeing the previous one's output; returns the final message.

    ``passes``: a chain gate (above), or None: every message runs through the chain. The adapters
    ask it before any event is built. Messages without a header (Join, Shutdown) are the gate's too.
    """

    def __init__(self, mods: Iterable[Mod] = (), passes: ChainGate | None = None) -> None:
        self.mods: tuple[Mod, ...] = tuple(mods)  # fixed: the hooks read ``recorder`` once
        for mod in self.mods:
            if not callable(mod):
                raise TypeError(f"a mod must be callable, got {mod!r}")
        self.passes = passes
        only = self.mods[0] if len(self.mods) == 1 else None
        self.recorder = only if isinstance(only, Recorder) else None  # run without events (Recorder)

    def __len__(self) -> int:
        return len(self.mods)

    def __call__(self, event: WireEvent) -> Message:
        for mod in self.mods:
            out = mod(event)
            if out is None:
                continue
            if type(out) is not type(event.message):
                raise TypeError(
                    f"mod {mod!r} returned {type(out).__name__} for a {type(event.message).__name__} "
                    f"({event.short_method} {event.direction}); a rewrite must keep the message type"
                )
            event = dataclasses.replace(event, message=out, data=None)  # the old bytes are not its
        return event.message


class Filter:
    """Runs ``mod`` only on some methods, directions and sides; other events pass untouched.

    ``methods`` accepts full names (``/vflnet.v1.Active/ExchangeEmbeddings``) or short ones
    (``ExchangeEmbeddings``); None means all.
    """

    def __init__(
        self,
        mod: Mod,
        *,
        methods: Sequence[str] | None = None,
        directions: Sequence[str] | None = None,
        sides: Sequence[str] | None = None,
    ) -> None:
        if not callable(mod):
            raise TypeError(f"a mod must be callable, got {mod!r}")
        for name, given, allowed in (("direction", directions, DIRECTIONS), ("side", sides, SIDES)):
            bad = sorted(set(given or ()) - set(allowed))
            if bad:
                raise ValueError(f"unknown {name} {bad}; expected some of {list(allowed)}")
        self.mod = mod
        self.methods = None if methods is None else frozenset(methods)
        self.directions = None if directions is None else frozenset(directions)
        self.sides = None if sides is None else frozenset(sides)

    def matches(self, event: WireEvent) -> bool:
        if self.methods is not None and not {event.method, short_name(event.method)} & self.methods:
            return False
        if self.directions is not None and event.direction not in self.directions:
            return False
        return self.sides is None or event.side in self.sides

    def __call__(self, event: WireEvent) -> Message | None:
        return self.mod(event) if self.matches(event) else None

    def __repr__(self) -> str:
        return (
            f"Filter({self.mod!r}, methods={self.methods}, directions={self.directions}, sides={self.sides})"
        )
