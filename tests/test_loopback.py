"""The loopback bridge behaves like gRPC for everything roles rely on: serialization, the mod chain on
both sides, statuses from handlers and refusing mods, deadlines, wait_for_ready, futures."""

from __future__ import annotations

import threading

import grpc
import pytest

from vflnet.interceptors.bridge import LoopbackBridge, add_handlers
from vflnet.interceptors.chain import Chain, Refused
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.errors import RpcFailure

SHUTDOWN = "/vflnet.v1.Party/Shutdown"


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def __call__(self, event):  # type: ignore[no-untyped-def]
        self.events.append((event.side, event.direction, event.short_method))


def _serve(bridge: LoopbackBridge, handler, chain: Chain | None = None, name: str = "server"):  # type: ignore[no-untyped-def]
    server = bridge.make_server(name, chain or Chain())
    add_handlers(server, {SHUTDOWN: handler})
    address = bridge.bind(server, name, "")
    server.start()
    return server, address


def test_messages_are_serialized_and_both_chains_see_them():
    bridge = LoopbackBridge()
    seen: list[messages_pb2.ShutdownRequest] = []

    def handler(req, ctx):  # type: ignore[no-untyped-def]
        seen.append(req)
        return messages_pb2.ShutdownReply(checkpoint=f"{req.reason}@{ctx.peer()}")

    server_taps, client_taps = Recorder(), Recorder()
    _, address = _serve(bridge, handler, Chain([server_taps]))
    stub = services_pb2_grpc.PartyStub(bridge.open_channel(address, "client", Chain([client_taps])))
    request = messages_pb2.ShutdownRequest(run_id="r", reason="done")
    reply = stub.Shutdown(request, timeout=5)
    assert reply.checkpoint == "done@loopback:client"
    assert seen[0] == request and seen[0] is not request  # the server got a parsed copy, not the object
    assert server_taps.events == [("server", "request", "Shutdown"), ("server", "response", "Shutdown")]
    assert client_taps.events == [("client", "request", "Shutdown"), ("client", "response", "Shutdown")]


def test_a_rewrite_on_the_client_changes_what_the_server_receives():
    bridge = LoopbackBridge()
    _, address = _serve(bridge, lambda req, ctx: messages_pb2.ShutdownReply(checkpoint=req.reason))

    def rewrite(event):  # type: ignore[no-untyped-def]
        if event.direction == "request":
            return messages_pb2.ShutdownRequest(run_id="r", reason="rewritten")
        return None

    stub = services_pb2_grpc.PartyStub(bridge.open_channel(address, "client", Chain([rewrite])))
    assert stub.Shutdown(messages_pb2.ShutdownRequest(reason="original"), timeout=5).checkpoint == "rewritten"


def test_statuses_from_handlers_and_refusing_mods_and_the_server_keeps_serving():
    bridge = LoopbackBridge()

    def handler(req, ctx):  # type: ignore[no-untyped-def]
        if req.reason == "bad":
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "bad reason")
        if req.reason == "crash":
            raise ZeroDivisionError("boom")
        return messages_pb2.ShutdownReply(checkpoint="ok")

    def refuse(event):  # type: ignore[no-untyped-def]
        if event.direction == "request" and event.message.reason == "refuse":
            raise Refused("not on my wire")
        return None

    _, address = _serve(bridge, handler, Chain([refuse]))
    stub = services_pb2_grpc.PartyStub(bridge.open_channel(address, "client", Chain()))
    for reason, code, text in [
        ("bad", grpc.StatusCode.INVALID_ARGUMENT, "bad reason"),
        ("crash", grpc.StatusCode.UNKNOWN, "boom"),
        ("refuse", grpc.StatusCode.PERMISSION_DENIED, "not on my wire"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            stub.Shutdown(messages_pb2.ShutdownRequest(reason=reason), timeout=5)
        assert info.value.code() == code and text in info.value.details()
    assert stub.Shutdown(messages_pb2.ShutdownRequest(reason="fine"), timeout=5).checkpoint == "ok"
    with pytest.raises(grpc.RpcError) as info:  # a method nobody serves
        stub.RunStep(messages_pb2.StepCommand(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_deadline_exceeded_settles_the_future_while_the_handler_still_runs():
    bridge = LoopbackBridge()
    release = threading.Event()

    def slow(req, ctx):  # type: ignore[no-untyped-def]
        release.wait(10)
        return messages_pb2.ShutdownReply()

    _, address = _serve(bridge, slow)
    stub = services_pb2_grpc.PartyStub(bridge.open_channel(address, "client", Chain()))
    done = threading.Event()
    call = stub.Shutdown.future(messages_pb2.ShutdownRequest(), timeout=0.2)
    call.add_done_callback(lambda _c: done.set())
    assert done.wait(5), "the deadline never fired"
    assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not release.is_set()
    release.set()


def test_unknown_address_is_unavailable_unless_waiting_for_a_server_that_binds_later():
    bridge = LoopbackBridge()
    stub = services_pb2_grpc.PartyStub(bridge.open_channel("loopback:late", "client", Chain()))
    with pytest.raises(grpc.RpcError) as info:
        stub.Shutdown(messages_pb2.ShutdownRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    started = threading.Timer(
        0.2, lambda: _serve(bridge, lambda r, c: messages_pb2.ShutdownReply(checkpoint="late"), name="late")
    )
    started.start()
    assert stub.Shutdown(messages_pb2.ShutdownRequest(), timeout=10, wait_for_ready=True).checkpoint == "late"
    started.join()
