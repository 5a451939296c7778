"""The calls vflnet hands to role code in place of gRPC's own: one that has failed already
(:class:`FailedCall`), and one that settles once (:class:`SettledCall`): a loopback call in flight
(vflnet/wire/loopback.py), a real call behind the client mod chain
(vflnet/interceptors/grpc_adapters.py) and a chunking channel's future (vflnet/wire/chunking.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc


class FailedCall(grpc.RpcError, grpc.Call, grpc.Future):
    """A call that failed on this side of the wire: a finished call with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> grpc.RpcError:
        return self

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        return self.__traceback__

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


class SettledCall(grpc.Call, grpc.Future):
    """A call that settles once, with a reply or an error, and then runs its done-callbacks once, on
    the thread that settled it.

    result() raises the error itself (the same object). The status comes from the error: an error that
    is a ``grpc.Call`` (a gRPC error, :class:`FailedCall`) gives its own code, details and metadata;
    any other exception gives UNKNOWN and its repr. A reply's details and metadata are those of the
    gRPC call that carried it, when ``settle`` is given one (else None and ()). A call settled with
    CANCELLED is cancelled().

    ``cancel`` (optional) cancels the source of the call, which then settles it; without it, cancel()
    settles the call with CANCELLED. ``wait`` (optional) blocks until the source is done, raising
    ``grpc.FutureTimeoutError`` after ``timeout``, and settles the call: a caller that waits settles it
    in its own thread rather than waiting on the source's callback thread.
    """

    def __init__(
        self,
        cancel: Callable[[], bool] | None = None,
        wait: Callable[[float | None], None] | None = None,
    ) -> None:
        self._cancel = cancel
        self._wait_source = wait
        self._lock = threading.Lock()
        self._done = False  # set under the lock after _response and _error; read without it
        self._event: threading.Event | None = None  # made by the first waiter: most calls have none
        self._callbacks: list[Callable[[Any], None]] = []
        self._response: Any = None
        self._error: BaseException | None = None
        self._carrier: grpc.Call | None = None  # the gRPC call that carried the reply, if known

    def settle(
        self, response: Any = None, error: BaseException | None = None, call: grpc.Call | None = None
    ) -> bool:
        """Settle with ``response``, or with ``error`` when it is given; False if settled already.
        ``call``: the gRPC call that carried ``response``, whose details and metadata this call reports."""
        with self._lock:
            if self._done:
                return False
            self._response, self._error, self._carrier = response, error, call
            self._done = True
        self._wake()
        return True

    def settle_with(self, outcome: Callable[[], Any]) -> bool:
        """Settle with what ``outcome()`` returns, or the exception it raises; ``outcome`` runs only if
        the call is not settled yet, under the lock, so it runs at most once."""
        with self._lock:
            if self._done:
                return False
            try:
                self._response = outcome()
            except Exception as exc:  # the call's error, for result(); a done-callback must not raise
                self._error = exc
            self._done = True
        self._wake()
        return True

    def _wake(self) -> None:
        """Wake the waiters, then run the done-callbacks: once, as nothing is added to either now."""
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        if self._wait_source is not None:
            self._wait_source(timeout)  # settles the call before it returns
            return
        with self._lock:
            if self._done:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            raise grpc.FutureTimeoutError()

    # grpc.Future
    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._response

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        error = self.exception(timeout)
        return None if error is None else error.__traceback__

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def cancel(self) -> bool:
        if self._done:
            return False
        if self._cancel is not None:
            return self._cancel()
        return self.settle(error=FailedCall(grpc.StatusCode.CANCELLED, "Locally cancelled by application!"))

    def cancelled(self) -> bool:
        status = self._status() if self._done and self._error is not None else None
        return status is not None and status.code() == grpc.StatusCode.CANCELLED

    def running(self) -> bool:
        return not self._done

    def done(self) -> bool:
        return self._done

    # grpc.Call / grpc.RpcContext
    def _status(self) -> grpc.Call | None:
        """The error, when it carries a status of its own; for a reply, the call that carried it."""
        if self._error is None:
            return self._carrier
        return self._error if isinstance(self._error, grpc.Call) else None

    def code(self) -> grpc.StatusCode:
        self._wait(None)
        if self._error is None:
            return grpc.StatusCode.OK
        status = self._status()
        return grpc.StatusCode.UNKNOWN if status is None else status.code()

    def details(self) -> str | None:
        self._wait(None)
        status = self._status()
        if status is None:
            return None if self._error is None else repr(self._error)
        return status.details()

    def initial_metadata(self) -> Any:
        self._wait(None)
        status = self._status()
        return () if status is None else status.initial_metadata()

    def trailing_metadata(self) -> Any:
        self._wait(None)
        status = self._status()
        return () if status is None else status.trailing_metadata()

    def is_active(self) -> bool:
        return not self._done

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if self._done:
                return False
            self._callbacks.append(lambda _: callback())
        return True
