"""SettledCall, the one future behind loopback, intercepted and chunked calls: it settles once, runs
its done-callbacks once, times out like a gRPC future, takes its status from its error and cancels."""

from __future__ import annotations

import threading

import grpc
import pytest

from vflnet.interceptors.bridge import LoopbackBridge, add_handlers
from vflnet.interceptors.chain import Chain
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.calls import FailedCall, SettledCall

SHUTDOWN = "/vflnet.v1.Party/Shutdown"


def test_settles_once_and_runs_each_callback_once() -> None:
    call = SettledCall()
    seen: list[tuple[str, object]] = []
    call.add_done_callback(lambda c: seen.append(("before", c.result())))
    assert call.running() and not call.done() and call.is_active()
    assert call.settle("reply")
    assert not call.settle("other") and not call.settle(error=RuntimeError("late"))
    assert not call.settle_with(lambda: pytest.fail("a settled call runs no outcome"))
    call.add_done_callback(lambda c: seen.append(("after", c.result())))  # runs at once
    assert seen == [("before", "reply"), ("after", "reply")]
    assert call.result() == "reply" and call.exception() is None and call.traceback() is None
    assert call.code() == grpc.StatusCode.OK and call.details() is None
    assert call.done() and not call.running() and not call.cancelled() and not call.cancel()
    assert not call.add_callback(lambda: None)  # the call has ended


def test_an_outcome_runs_once_when_two_threads_settle_at_once() -> None:
    call = SettledCall()
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def outcome() -> str:
        runs.append(1)
        entered.set()
        release.wait(10)
        return "reply"

    first = threading.Thread(target=call.settle_with, args=(outcome,))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=call.settle_with, args=(outcome,))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert runs == [1] and call.result() == "reply"


def test_waiting_times_out_like_a_grpc_future() -> None:
    call = SettledCall()
    for wait in (call.result, call.exception, call.traceback):
        with pytest.raises(grpc.FutureTimeoutError):
            wait(timeout=0.01)
    threading.Timer(0.05, call.settle, ["late"]).start()
    assert call.result(timeout=10) == "late"


def test_status_comes_from_the_error() -> None:
    refused = FailedCall(grpc.StatusCode.PERMISSION_DENIED, "not on my wire")
    call = SettledCall()
    call.settle(error=refused)
    with pytest.raises(FailedCall) as info:
        call.result()
    assert info.value is refused and call.exception() is refused
    assert call.code() == grpc.StatusCode.PERMISSION_DENIED and call.details() == "not on my wire"
    assert call.trailing_metadata() == () and not call.cancelled()

    bug = ZeroDivisionError("bug in a tap")

    def buggy() -> None:
        raise bug

    call = SettledCall()
    call.settle_with(buggy)
    with pytest.raises(ZeroDivisionError) as raised:
        call.result()
    assert raised.value is bug  # re-raised as is
    assert call.code() == grpc.StatusCode.UNKNOWN and call.details() == repr(bug)


def test_a_reply_reports_the_details_of_the_call_that_carried_it() -> None:
    """(Its metadata too: tests/test_chunking.py checks a real gRPC call's trailer.)"""
    carrier = FailedCall(grpc.StatusCode.OK, "carried")  # a finished call, as settle() is given one
    call = SettledCall()
    assert call.settle("reply", call=carrier)
    assert call.result() == "reply" and call.code() == grpc.StatusCode.OK and not call.cancelled()
    assert call.details() == "carried" and call.trailing_metadata() == ()

    refused = FailedCall(grpc.StatusCode.PERMISSION_DENIED, "not on my wire")
    call = SettledCall()
    call.settle(error=refused, call=carrier)  # an error gives its own status
    assert call.code() == grpc.StatusCode.PERMISSION_DENIED and call.details() == "not on my wire"


def test_cancel_without_a_hook_settles_cancelled() -> None:
    call = SettledCall()
    callbacks: list[str] = []
    assert call.add_callback(lambda: callbacks.append("ended"))
    assert call.cancel() and call.cancelled() and call.done()
    assert call.code() == grpc.StatusCode.CANCELLED and callbacks == ["ended"]
    with pytest.raises(grpc.RpcError):
        call.result()
    assert not call.cancel()  # settled: nothing left to cancel


def _relay(source: SettledCall) -> SettledCall:
    """A call over ``source``, as the client interceptor puts one over the real call."""

    def wait(timeout: float | None) -> None:
        source.exception(timeout)
        call.settle_with(lambda: f"{source.result()} (settled by the caller)")

    call = SettledCall(cancel=source.cancel, wait=wait)
    source.add_done_callback(lambda s: call.settle_with(lambda: s.result()))
    return call


def test_cancel_and_wait_hooks_reach_the_source() -> None:
    source = SettledCall()
    call = _relay(source)
    with pytest.raises(grpc.FutureTimeoutError):  # the source's timeout, through the hook
        call.result(timeout=0.01)
    assert call.cancel() and source.cancelled() and call.cancelled()
    assert call.exception() is source.exception()  # the source's error, unchanged

    source = SettledCall()
    callback_thread = threading.Event()
    source.add_done_callback(lambda _: callback_thread.wait(10))  # holds up the relay's callback
    call = _relay(source)
    threading.Timer(0.05, source.settle, ["reply"]).start()
    assert call.result(timeout=10) == "reply (settled by the caller)"  # not by the callback thread
    callback_thread.set()


def test_a_response_tap_runs_though_the_caller_never_reads_the_reply() -> None:
    bridge = LoopbackBridge()
    server = bridge.make_server("server", Chain())
    add_handlers(server, {SHUTDOWN: lambda req, ctx: messages_pb2.ShutdownReply(checkpoint="ok")})
    address = bridge.bind(server, "server", "")
    server.start()
    tapped = threading.Event()

    def tap(event):  # type: ignore[no-untyped-def]
        if event.direction == "response":
            tapped.set()

    stub = services_pb2_grpc.PartyStub(bridge.open_channel(address, "client", Chain([tap])))
    call = stub.Shutdown.future(messages_pb2.ShutdownRequest(), timeout=5)
    assert tapped.wait(10)  # no result() call
    assert call.result().checkpoint == "ok" and call.code() == grpc.StatusCode.OK
