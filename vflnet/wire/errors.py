"""Errors a servicer maps to gRPC status codes, so a bad message gets a status and the server keeps serving."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from vflnet.durable import WriteFailed
from vflnet.wire.channels import MessageTooLarge
from vflnet.wire.decoding import Undecodable
from vflnet.wire.tensors import PayloadError

log = logging.getLogger(__name__)


class RpcFailure(Exception):
    """Raise inside a servicer to answer with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def shown(text: str, limit: int = 64) -> str:
    """A caller-supplied name or id as it goes into a status or a log line: quoted and cut to ``limit``
    characters (a 10 kB name in a status' details overflows gRPC's metadata limit and floods logs)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


class _Throttle:
    """Log a repeated refusal at its 1st, 2nd, 4th, 8th, ... occurrence, with the count."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, key: str) -> int | None:
        n = self.counts[key] = self.counts.get(key, 0) + 1
        return n if n & (n - 1) == 0 else None


_throttle = _Throttle()


def stale_step(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, message)


def permission_denied(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.PERMISSION_DENIED, message)


def invalid(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


def wrong_state(message: str) -> RpcFailure:
    """A request the receiver cannot serve in its current state (no tree started, not training)."""
    return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, message)


def malformed(message: str) -> RpcFailure:
    """A peer's payload that does not decode into what the protocol expects."""
    return RpcFailure(grpc.StatusCode.DATA_LOSS, message)


def not_found(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.NOT_FOUND, message)


def duplicate(message: str) -> RpcFailure:
    """A message the receiver already has for this step."""
    return RpcFailure(grpc.StatusCode.ALREADY_EXISTS, message)


def aborted(message: str) -> RpcFailure:
    """The step failed elsewhere (the active party's computation): the waiting call is released."""
    return RpcFailure(grpc.StatusCode.ABORTED, message)


def handle_errors(
    fn: Callable[[Any, grpc.ServicerContext], Any], name: str = ""
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """A handler ``fn(request, context)`` whose errors become gRPC statuses, logged on the serving side."""
    name = name or getattr(fn, "__name__", "handler")

    @functools.wraps(fn)
    def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            count = _throttle(f"undecodable {name}")
            if count:
                log.warning("%s refused an undecodable message (%d so far): %s", name, count, request.error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: the request is not a valid message")
        try:
            return fn(request, context)
        except RpcFailure as exc:
            count = _throttle(f"{name} {exc.code.name}")
            if count:
                log.warning("%s refused (%d so far): %s: %s", name, count, exc.code.name, exc.message)
            context.abort(exc.code, exc.message)
        except PayloadError as exc:
            log.warning("%s refused a malformed payload: %s", name, exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except MessageTooLarge as exc:
            log.warning("%s cannot send: %s", name, exc)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except TimeoutError as exc:
            log.warning("%s timed out: %s", name, exc)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except WriteFailed as exc:  # a full disk: the caller is told which file, in one line
            log.error("%s: %s", name, exc)
            context.abort(grpc.StatusCode.ABORTED, str(exc))

    return wrapper


def describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'UNKNOWN'}: {details}"
