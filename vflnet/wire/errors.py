"""Errors a servicer maps to gRPC status codes, so a bad message gets a status and the server keeps serving."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from vflnet.wire.channels import MessageTooLarge
from vflnet.wire.tensors import PayloadError

log = logging.getLogger(__name__)


class RpcFailure(Exception):
    """Raise inside a servicer to answer with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def stale_step(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, message)


def permission_denied(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.PERMISSION_DENIED, message)


def invalid(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


F = TypeVar("F", bound=Callable[..., Any])


def servicer_method(fn: F) -> F:
    """Turn the errors a handler may raise into gRPC statuses, and log them on the serving side."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except RpcFailure as exc:
            log.warning("%s refused: %s: %s", fn.__name__, exc.code.name, exc.message)
            context.abort(exc.code, exc.message)
        except PayloadError as exc:
            log.warning("%s refused a malformed payload: %s", fn.__name__, exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except MessageTooLarge as exc:
            log.warning("%s cannot send: %s", fn.__name__, exc)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except TimeoutError as exc:
            log.warning("%s timed out: %s", fn.__name__, exc)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))

    return wrapper  # type: ignore[return-value]


def describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'UNKNOWN'}: {details}"
