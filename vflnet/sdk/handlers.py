"""A protocol's messages, served and sent through the host: the checks and the metering live here.

Serving: a side marks each of its service methods with ``@handles(METHOD, callers=...)``. The host
registers every marked method (``serve_handlers``, called by the sides' default ``add_services``)
wrapped so that, before the method runs, the request belongs to this run and its sender is a roster
party of an allowed role (its certificate's identity under mutual TLS), and, where asked, the party
has finished joining; after it, the reply's size is checked against ``transport.max_payload_mb`` and
its bytes are metered (``meter_reply=False``: the side does both where it builds the reply). An
exception becomes a gRPC status (vflnet/wire/errors.py); the server keeps serving. The callers also
become the method's permissions under mutual TLS, and the marked methods the protocol's method table
(``Protocol.methods``), from this one declaration. When the protocol registers, ``handler_problems``
checks each marked method against its service (vflnet/registration.py).

Sending: ``send`` checks a request's size, meters it and starts the call with the step's deadline;
its ``result()`` turns a failed call into a status that names the peer and what was asked. ``call``
does the same as one blocking call, for a caller that waits for the reply at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from vflnet.interceptors.bridge import Server, add_handlers, unary
from vflnet.interceptors.events import METHODS, short_name
from vflnet.wire.channels import check_message_size
from vflnet.wire.checks import check_run, check_sender
from vflnet.wire.errors import RpcFailure, describe_rpc_error

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__vflnet_handles__"


@dataclass(frozen=True)
class Handles:
    """What ``@handles`` declares about one service method of a side."""

    method: str  # full gRPC name, e.g. "/vflnet.v1.Active/ExchangeEmbeddings"
    callers: frozenset[str]  # the roles that may call it
    wait_for_admission: bool  # a call that arrives before this party joined waits (bounded) for it
    meter_reply: (
        bool  # False only where the side checks the reply's size and meters it itself, as it builds it
    )


def handles(
    method: str, callers: Iterable[str], *, wait_for_admission: bool = False, meter_reply: bool = True
) -> Callable[[F], F]:
    """Mark a side's method ``(request, context) -> reply`` as the server of ``method``."""
    roles = frozenset(callers)
    unknown = roles - {"coordinator", "active", "passive"}
    if not roles or unknown:
        raise ValueError(
            f"@handles({method!r}): callers must be roles among coordinator/active/passive, got {sorted(roles)}"
        )

    def mark(fn: F) -> F:
        setattr(fn, _MARK, Handles(method, roles, wait_for_admission, meter_reply))
        return fn

    return mark


def handlers_of(side: type) -> dict[str, Handles]:
    """A side class's marked methods: attribute name -> declaration (inherited ones included)."""
    found: dict[str, Handles] = {}
    for attr in dir(side):
        spec = getattr(getattr(side, attr, None), _MARK, None)
        if isinstance(spec, Handles):
            found[attr] = spec
    return found


def handler_problems(side: type) -> list[str]:
    """What would break when ``side``'s marked methods are served: a method no registered gRPC service
    declares (``register_messages``), one method marked twice (one of them would never run), a handler
    that does not take ``(request, context)``, or annotated request/reply types other than the method's."""
    problems = []
    first: dict[str, str] = {}
    for attr, spec in sorted(handlers_of(side).items()):
        where = f"{side.__qualname__}.{attr}"
        if spec.method in first:
            problems.append(f"{where} and {side.__qualname__}.{first[spec.method]} both handle {spec.method}")
            continue
        first[spec.method] = attr
        fn = getattr(side, attr)
        try:
            inspect.signature(fn).bind(None, None, None)  # self, request, context
        except TypeError:
            problems.append(f"{where} must take (self, request, context), not {inspect.signature(fn)}")
            continue
        types = METHODS.get(spec.method)
        if types is None:
            problems.append(
                f"{where} handles {spec.method}, which no registered gRPC service declares (register the "
                "plug-in's service with vflnet.sdk.register_messages before the class is defined)"
            )
            continue
        request, response = _annotated_types(fn)
        for what, declared, expected in (("request", request, types[0]), ("reply", response, types[1])):
            if declared is not None and declared is not expected:
                problems.append(
                    f"{where} takes its {what} as {declared.__name__}, but {spec.method}'s {what} is "
                    f"{expected.DESCRIPTOR.full_name}"
                )
    return problems


def _annotated_types(fn: Callable[..., Any]) -> tuple[type | None, type | None]:
    """The message classes a handler's request parameter and return are annotated with; None where an
    annotation is missing, not a message class, or cannot be resolved here (a TYPE_CHECKING import)."""

    def resolve(annotation: Any) -> type | None:
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, getattr(fn, "__globals__", {}))  # noqa: S307 - the module's own
            except Exception:  # an annotation only a type checker can resolve: nothing to compare
                return None
        return annotation if isinstance(annotation, type) and issubclass(annotation, Message) else None

    params = list(inspect.signature(fn).parameters.values())
    request = resolve(params[1].annotation) if len(params) > 1 else None
    return request, resolve(inspect.signature(fn).return_annotation)


def serve_handlers(server: Server, side: Any, host: Any) -> None:
    """Register every ``@handles`` method of ``side`` on ``server``, wrapped with the host's checks."""
    handlers = {
        spec.method: _checked(getattr(side, attr), spec, host)
        for attr, spec in handlers_of(type(side)).items()
    }
    if handlers:
        add_handlers(server, handlers)


def check_and_meter(host: Any, name: str, msg: Message, what: str) -> None:
    """Refuse ``msg`` if it is over ``transport.max_payload_mb`` (the error names ``what``), else count
    it in the host's meter as ``name`` (the coordinator meters nothing). For a side that builds a
    reply itself (``meter_reply=False``), so its bytes count in the step's report."""
    size = check_message_size(msg, host.cfg.transport, what)
    meter = getattr(host, "meter", None)
    if meter is not None:
        meter.record(name, msg, size)


def _checked(fn: Callable[[Any, Any], Message], spec: Handles, host: Any) -> Callable[[Any, Any], Message]:
    short = short_name(spec.method)

    def handler(request: Any, context: Any) -> Message:
        h = request.header
        check_run(host.cfg, h.run_id)
        check_sender(host.cfg, h.sender, set(spec.callers), context)
        if spec.wait_for_admission and not host.ready.is_set():
            host.waitroom.wait(h.sender, context, host.step_deadline_s)
        reply = fn(request, context)
        if spec.meter_reply:  # else the side checked and metered the reply where it built it
            check_and_meter(host, f"{short}.reply", reply, f"{host.name}'s {short} reply to {h.sender}")
        return reply

    handler.__name__ = getattr(fn, "__name__", short)
    return handler


class Pending:
    """A call on its way: ``result()`` waits for the reply, or raises a status naming peer and method."""

    def __init__(self, future: grpc.Future, peer: str, method: str) -> None:
        self.future, self.peer, self.method = future, peer, method

    def result(self) -> Any:
        try:
            return self.future.result()
        except grpc.RpcError as exc:
            raise _refused(self.peer, self.method, exc) from exc


def _refused(peer: str, method: str, exc: grpc.RpcError) -> RpcFailure:
    return RpcFailure(
        grpc.StatusCode.ABORTED, f"{peer} refused {short_name(method)}: {describe_rpc_error(exc)}"
    )


def _outgoing(host: Any, peer: str, method: str, request: Message) -> None:
    short = short_name(method)
    check_and_meter(host, short, request, f"{host.name}'s {short} to {peer}")


def send(host: Any, channel: grpc.Channel, peer: str, method: str, request: Message) -> Pending:
    """Check ``request``'s size, meter it and start the call to ``peer`` with the step's deadline."""
    _outgoing(host, peer, method, request)
    return Pending(unary(channel, method).future(request, timeout=host.step_deadline_s), peer, method)


def call(host: Any, channel: grpc.Channel, peer: str, method: str, request: Message) -> Any:
    """``send(...).result()`` as one blocking call: gRPC polls it on the caller's thread, where a
    future's reply comes through the channel's polling thread and a hand-off to the caller."""
    _outgoing(host, peer, method, request)
    try:
        return unary(channel, method)(request, timeout=host.step_deadline_s)
    except grpc.RpcError as exc:
        raise _refused(peer, method, exc) from exc
