"""Errors a servicer maps to gRPC status codes, so a bad message gets a status and the server keeps serving."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

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


def handle_errors(
    fn: Callable[[Any, grpc.ServicerContext], Any], name: str = ""
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """A handler ``fn(request, context)`` whose errors become gRPC statuses, logged on the serving side."""
    name = name or getattr(fn, "__name__", "handler")

    @functools.wraps(fn)
    def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request, context)
        except RpcFailure as exc:
            log.warning("%s refused: %s: %s", name, exc.code.name, exc.message)
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

    return wrapper


def describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'UNKNOWN'}: {details}"
