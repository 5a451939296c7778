"""Mods, chains and their gRPC bindings on real servers bound to 127.0.0.1 (ephemeral ports).

Each server-side and client-side test runs with both bindings of a chain: the hooks the chunking
layer runs (``hook``, how a party's own servers and channels carry its chain) and the interceptors
for any gRPC server or channel (``interceptor``)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest

from vflnet.interceptors import (
    METHODS,
    Chain,
    ClientChainInterceptor,
    Filter,
    Refused,
    ServerChainInterceptor,
    WireEvent,
    intercept_channel,
)
from vflnet.interceptors.grpc_adapters import ClientChainHook, ServerChainHook
from vflnet.v1 import messages_pb2, services_pb2_grpc, tensor_pb2
from vflnet.wire import tensors
from vflnet.wire.channels import TransportConfig, bind, make_server, open_channel

DEADLINE = 5.0
EXCHANGE = "/vflnet.v1.Active/ExchangeEmbeddings"
RUN_STEP = "/vflnet.v1.Party/RunStep"
JOIN = "/vflnet.v1.Coordinator/Join"


def embeddings(
    step: int = 1, n: int = 4, dim: int = 3, seed: int = 0, batch_id: int = 0
) -> messages_pb2.Embeddings:
    rng = np.random.default_rng(seed)
    return messages_pb2.Embeddings(
        header=messages_pb2.Header(
            run_id="r1",
            step=step,
            batch_id=batch_id,
            sender="passive-1",
            model_version=step - 1,
            epoch=0,
            phase=messages_pb2.TRAIN,
        ),
        sample_ids=np.arange(10, 10 + n).tolist(),
        values=tensors.to_proto(rng.normal(size=(n, dim)).astype(np.float32)),
    )


def values_of(msg: messages_pb2.Embeddings | messages_pb2.EmbeddingGradients) -> np.ndarray:
    return tensors.from_proto(msg.values)


class EchoActive(services_pb2_grpc.ActiveServicer):
    """Answers embeddings with "gradients" equal to them; step < 0 is refused like a stale step.

    batch_id 1 waits for a batch_id 2 call to open a gate (to show futures stay concurrent)."""

    def __init__(self) -> None:
        self.received: list[messages_pb2.Embeddings] = []
        self.deadlines: list[float | None] = []
        self.gate = threading.Event()

    def ExchangeEmbeddings(  # noqa: N802 - gRPC's name
        self, request: messages_pb2.Embeddings, context: grpc.ServicerContext
    ) -> messages_pb2.EmbeddingGradients:
        self.received.append(request)
        self.deadlines.append(context.time_remaining())
        if request.header.step < 0:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"step {request.header.step} is stale")
        if request.header.batch_id == 1 and not self.gate.wait(DEADLINE):
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "gate never opened")
        if request.header.batch_id == 2:
            self.gate.set()
        header = messages_pb2.Header()
        header.CopyFrom(request.header)
        header.sender = "active"
        return messages_pb2.EmbeddingGradients(header=header, values=request.values)


class EchoParty(services_pb2_grpc.PartyServicer):
    def RunStep(  # noqa: N802 - gRPC's name
        self, request: messages_pb2.StepCommand, context: grpc.ServicerContext
    ) -> messages_pb2.StepReport:
        return messages_pb2.StepReport(
            header=request.header, metrics={"count": float(len(request.sample_ids))}
        )


BINDINGS = ("hook", "interceptor")


def start_server(
    active: EchoActive, chain: Chain | None = None, binding: str = "interceptor"
) -> tuple[grpc.Server, str]:
    """A plain gRPC server with ``chain`` as an interceptor, or a party's server (chunking layer)
    with ``chain`` as its hook."""
    if binding == "hook":
        hook = ServerChainHook(chain, "active") if chain is not None else None
        server = make_server(TransportConfig(), "active", max_workers=4, hook=hook)
    else:
        interceptors = [ServerChainInterceptor(chain, "active")] if chain is not None else []
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=interceptors)
    services_pb2_grpc.add_ActiveServicer_to_server(active, server)
    services_pb2_grpc.add_PartyServicer_to_server(EchoParty(), server)
    port = bind(server, "127.0.0.1:0", TransportConfig(), "active")
    server.start()
    return server, f"127.0.0.1:{port}"


class Recorder:
    """A tap: remembers every event."""

    def __init__(self) -> None:
        self.events: list[WireEvent] = []

    def __call__(self, event: WireEvent) -> None:
        self.events.append(event)


def scale_values(factor: float, cls: type) -> object:
    """A rewrite: the same message with its ``values`` tensor multiplied by ``factor``."""

    def mod(event: WireEvent) -> messages_pb2.Embeddings | None:
        if not isinstance(event.message, cls):
            return None
        out = type(event.message)()
        out.CopyFrom(event.message)
        out.values.CopyFrom(tensors.to_proto(event.tensors()["values"] * factor))
        return out

    return mod


@pytest.fixture
def active() -> EchoActive:
    return EchoActive()


@pytest.fixture
def plain_server(active: EchoActive) -> Iterator[str]:
    server, address = start_server(active)
    yield address
    server.stop(grace=0)


# ---------------------------------------------------------------------------------------- events
def test_method_table_covers_every_service() -> None:
    assert METHODS[EXCHANGE] == (messages_pb2.Embeddings, messages_pb2.EmbeddingGradients)
    assert METHODS[RUN_STEP] == (messages_pb2.StepCommand, messages_pb2.StepReport)
    # plug-in protocols add their own services (vflnet.sdk.contract.register_messages): only vflnet's here
    assert {m for m in METHODS if m.startswith("/vflnet.v1.")} == {
        "/vflnet.v1.Coordinator/Join",
        "/vflnet.v1.Coordinator/Decrypt",
        "/vflnet.v1.Coordinator/ReceiveModel",
        "/vflnet.v1.Party/Align",
        RUN_STEP,
        "/vflnet.v1.Party/Shutdown",
        "/vflnet.v1.Party/ReleaseModel",
        "/vflnet.v1.Party/ReceiveModel",
        EXCHANGE,
    }


def test_event_decodes_header_ids_tensors_and_ciphertexts() -> None:
    msg = embeddings(step=7, n=5, dim=2, batch_id=3)
    event = WireEvent("request", "client", EXCHANGE, "passive-1", "127.0.0.1:1", msg, time=12.5)
    assert event.short_method == "ExchangeEmbeddings"
    assert (event.run_id, event.step, event.batch_id, event.sender) == ("r1", 7, 3, "passive-1")
    assert (event.model_version, event.epoch, event.phase) == (6, 0, messages_pb2.TRAIN)
    np.testing.assert_array_equal(event.sample_ids, np.arange(10, 15))
    assert event.sample_ids.dtype == np.int64
    decoded = event.tensors()
    assert list(decoded) == ["values"]
    np.testing.assert_array_equal(decoded["values"], values_of(msg))
    assert event.ciphertexts() == {}
    assert "step=7" in event.describe() and "values=float32[5, 2]" in event.describe()

    cipher = messages_pb2.Embeddings(
        header=msg.header, cipher=tensor_pb2.CipherTensor(key_id="k", shape=[5, 2])
    )
    event = WireEvent("request", "server", EXCHANGE, "active", "peer", cipher)
    assert event.tensors() == {}
    assert list(event.ciphertexts()) == ["cipher"] and event.ciphertexts()["cipher"].key_id == "k"


def test_event_without_header_or_ids() -> None:
    join = WireEvent(
        "request",
        "server",
        "/vflnet.v1.Coordinator/Join",
        "c",
        "p",
        messages_pb2.JoinRequest(run_id="r1", name="a", sample_ids=[3, 1]),
    )
    assert join.header is None and join.step is None and join.sender is None
    np.testing.assert_array_equal(join.sample_ids, [3, 1])
    report = WireEvent("response", "server", RUN_STEP, "a", "p", messages_pb2.StepReport())
    assert report.sample_ids is None and report.step == 0


def test_an_event_is_timed_when_built_frozen_and_replaced_whole() -> None:
    """The hooks build an event for every message a traced party sends or receives: its time is when
    it was built unless given, it cannot be changed, and a rewrite's copy keeps every other field."""
    before = time.time()
    event = WireEvent("request", "client", RUN_STEP, "a", "p", messages_pb2.StepReport(), data=b"x")
    assert before <= event.time <= time.time() and event.data == b"x"
    assert WireEvent("request", "client", RUN_STEP, "a", "p", messages_pb2.StepReport(), 5.0).time == 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.peer = "q"  # type: ignore[misc]
    other = messages_pb2.StepReport(metrics={"loss": 1.0})
    copy = dataclasses.replace(event, message=other, data=None)
    assert (copy.direction, copy.side, copy.method, copy.party, copy.peer, copy.time) == (
        "request",
        "client",
        RUN_STEP,
        "a",
        "p",
        event.time,
    )
    assert copy.message is other and copy.data is None and copy != event


def test_step_blocks_pass_the_odd_blocks_on_before_any_event_is_built() -> None:
    """`vflnet bench goals` times the trace tap inside one run: with its chain gate of blocks of N
    (tools/bench/tap_ab.py) the hooks run the chain on the steps of even blocks of N only, and hand the
    odd blocks' messages on as they are (as a party without a chain would); a message with no step
    always runs through it."""
    from vflnet.tools.bench.tap_ab import odd_blocks

    seen: list[tuple[str, str, int | None]] = []
    chain = Chain([lambda e: seen.append((e.side, e.direction, e.step))], passes=odd_blocks(2))
    server, client = ServerChainHook(chain, "active"), ClientChainHook(chain, "passive-1", "t")
    for step in range(6):
        msg = embeddings(step)
        for out in (
            server.request(EXCHANGE, msg, "p"),
            server.response(EXCHANGE, msg, "p"),
            client.request(EXCHANGE, msg),
            client.response(EXCHANGE, msg),
        ):
            assert out is msg
    join = messages_pb2.JoinRequest(run_id="r1", name="passive-1")
    assert client.request(JOIN, join) is join
    sides = [("server", "request"), ("server", "response"), ("client", "request"), ("client", "response")]
    assert seen == [(*side, step) for step in (0, 1, 4, 5) for side in sides] + [("client", "request", None)]
    with pytest.raises(ValueError, match="blocks must be a positive number"):
        odd_blocks(-1)


def test_nested_tensors_are_found_by_path() -> None:
    tmap = tensor_pb2.TensorMap()
    tmap.tensors["w"].CopyFrom(tensors.to_proto(np.ones((2, 2), dtype=np.float32)))
    tmap.tensors["b"].CopyFrom(tensors.to_proto(np.zeros(2, dtype=np.float64)))
    event = WireEvent("request", "client", "/x.Y/Z", "p", "q", tmap)
    assert sorted(event.tensors()) == ["tensors.b", "tensors.w"]
    assert event.tensors()["tensors.b"].dtype == np.float64


# ---------------------------------------------------------------------------------------- chain
def test_chain_runs_mods_in_list_order_each_seeing_the_previous_output() -> None:
    seen: list[tuple[str, float]] = []

    def tap(name: str) -> object:
        def mod(event: WireEvent) -> None:
            seen.append((name, float(event.tensors()["values"][0, 0])))

        return mod

    msg = embeddings()
    first = float(values_of(msg)[0, 0])
    chain = Chain(
        [
            tap("a"),
            scale_values(2.0, messages_pb2.Embeddings),
            tap("b"),
            scale_values(10.0, messages_pb2.Embeddings),
            tap("c"),
        ]
    )
    out = chain(WireEvent("request", "client", EXCHANGE, "p", "q", msg))
    assert [name for name, _ in seen] == ["a", "b", "c"]
    np.testing.assert_allclose([v for _, v in seen], [first, 2 * first, 20 * first], rtol=1e-6)
    np.testing.assert_allclose(values_of(out), values_of(msg) * 20, rtol=1e-6)
    assert float(values_of(msg)[0, 0]) == first  # the original message is untouched


def test_chain_without_rewrite_returns_the_same_object_and_rejects_type_changes() -> None:
    msg = embeddings()
    event = WireEvent("request", "client", EXCHANGE, "p", "q", msg)
    assert Chain([Recorder()])(event) is msg
    assert Chain()(event) is msg
    with pytest.raises(TypeError, match="keep the message type"):
        Chain([lambda e: messages_pb2.StepCommand()])(event)
    with pytest.raises(TypeError, match="callable"):
        Chain([42])  # type: ignore[list-item]


def test_filter_limits_a_mod_to_methods_directions_and_sides() -> None:
    rec = Recorder()
    mod = Filter(rec, methods=["ExchangeEmbeddings"], directions=["request"], sides=["client", "proxy"])
    msg = embeddings()
    for direction, side, method in [
        ("request", "client", EXCHANGE),
        ("response", "client", EXCHANGE),
        ("request", "server", EXCHANGE),
        ("request", "proxy", EXCHANGE),
        ("request", "client", RUN_STEP),
    ]:
        mod(WireEvent(direction, side, method, "p", "q", msg))  # type: ignore[arg-type]
    assert [(e.direction, e.side, e.method) for e in rec.events] == [
        ("request", "client", EXCHANGE),
        ("request", "proxy", EXCHANGE),
    ]
    assert Filter(rec, methods=[EXCHANGE]).matches(WireEvent("response", "server", EXCHANGE, "p", "q", msg))
    with pytest.raises(ValueError, match="unknown direction"):
        Filter(rec, directions=["sideways"])


# ---------------------------------------------------------------------------------------- server side
@pytest.mark.parametrize("binding", BINDINGS)
def test_server_tap_and_rewrite_change_what_the_servicer_receives(active: EchoActive, binding: str) -> None:
    before, after = Recorder(), Recorder()
    chain = Chain([before, scale_values(3.0, messages_pb2.Embeddings), after])
    server, address = start_server(active, chain, binding)
    try:
        with grpc.insecure_channel(address) as channel:
            msg = embeddings(step=4)
            reply = services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    np.testing.assert_allclose(values_of(active.received[0]), values_of(msg) * 3, rtol=1e-6)
    np.testing.assert_allclose(values_of(reply), values_of(msg) * 3, rtol=1e-6)
    assert [(e.direction, e.side, e.step) for e in before.events] == [
        ("request", "server", 4),
        ("response", "server", 4),
    ]
    assert before.events[0].message == msg  # the tap before the rewrite saw the original
    assert all(e.party == "active" and e.method == EXCHANGE for e in before.events)
    assert before.events[0].peer.startswith("ipv4:127.0.0.1:")
    assert before.events[1].sender == "active"


@pytest.mark.parametrize("binding", BINDINGS)
def test_server_response_rewrite_changes_what_the_client_gets(active: EchoActive, binding: str) -> None:
    chain = Chain([scale_values(-1.0, messages_pb2.EmbeddingGradients)])
    server, address = start_server(active, chain, binding)
    try:
        with grpc.insecure_channel(address) as channel:
            msg = embeddings()
            reply = services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    np.testing.assert_array_equal(values_of(active.received[0]), values_of(msg))
    np.testing.assert_array_equal(values_of(reply), -values_of(msg))


@pytest.mark.parametrize("binding", BINDINGS)
def test_server_refusal_fails_one_call_and_the_server_keeps_serving(active: EchoActive, binding: str) -> None:
    def refuse_step_two(event: WireEvent) -> None:
        if event.direction == "request" and event.step == 2:
            raise Refused("step 2 looks replayed", grpc.StatusCode.INVALID_ARGUMENT)

    server, address = start_server(active, Chain([refuse_step_two]), binding)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = services_pb2_grpc.ActiveStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.ExchangeEmbeddings(embeddings(step=2), timeout=DEADLINE)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "step 2 looks replayed" in info.value.details()
            stub.ExchangeEmbeddings(embeddings(step=3), timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    assert [m.header.step for m in active.received] == [3]


@pytest.mark.parametrize("binding", BINDINGS)
def test_server_errors_pass_through_unchanged(active: EchoActive, binding: str) -> None:
    rec = Recorder()
    server, address = start_server(active, Chain([rec]), binding)
    try:
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(
                    embeddings(step=-1), timeout=DEADLINE
                )
    finally:
        server.stop(grace=0)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == "step -1 is stale"
    assert [e.direction for e in rec.events] == ["request"]


# ---------------------------------------------------------------------------------------- client side
def client_stub(
    address: str, chain: Chain, binding: str
) -> tuple[grpc.Channel, services_pb2_grpc.ActiveStub]:
    """A party's channel (chunking layer) with ``chain`` as its hook, or a plain gRPC channel with
    ``chain`` as an interceptor."""
    if binding == "hook":
        channel = open_channel(
            address, TransportConfig(), "passive-1", hook=ClientChainHook(chain, "passive-1", address)
        )
        return channel, services_pb2_grpc.ActiveStub(channel)
    channel = grpc.insecure_channel(address)
    return channel, services_pb2_grpc.ActiveStub(intercept_channel(channel, chain, "passive-1", address))


@pytest.mark.parametrize("binding", BINDINGS)
def test_client_tap_and_rewrites_on_blocking_with_call_and_future(
    active: EchoActive, plain_server: str, binding: str
) -> None:
    rec = Recorder()
    chain = Chain(
        [
            scale_values(2.0, messages_pb2.Embeddings),  # what the server receives
            rec,
            scale_values(5.0, messages_pb2.EmbeddingGradients),  # what the caller's stub returns
        ]
    )
    channel, stub = client_stub(plain_server, chain, binding)
    msg = embeddings()
    with channel:
        blocking = stub.ExchangeEmbeddings(msg, timeout=DEADLINE)
        with_call, call = stub.ExchangeEmbeddings.with_call(msg, timeout=DEADLINE)
        future = stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE)
        from_future = future.result()
    for reply in (blocking, with_call, from_future):
        np.testing.assert_allclose(values_of(reply), values_of(msg) * 10, rtol=1e-6)
    assert call.code() == grpc.StatusCode.OK
    assert future.exception() is None and future.done()
    for received in active.received:
        np.testing.assert_allclose(values_of(received), values_of(msg) * 2, rtol=1e-6)
    assert [e.direction for e in rec.events] == ["request", "response"] * 3
    assert all(e.side == "client" and e.peer == plain_server and e.party == "passive-1" for e in rec.events)
    np.testing.assert_allclose(rec.events[1].tensors()["values"], values_of(msg) * 2, rtol=1e-6)


@pytest.mark.parametrize("binding", BINDINGS)
def test_client_futures_stay_concurrent(active: EchoActive, plain_server: str, binding: str) -> None:
    """The coordinator fans RunStep out with .future(): the interceptor must not wait for a reply first."""
    rec = Recorder()
    channel, stub = client_stub(plain_server, Chain([rec]), binding)
    with channel:
        waiting = stub.ExchangeEmbeddings.future(embeddings(batch_id=1), timeout=DEADLINE)
        opener = stub.ExchangeEmbeddings.future(embeddings(batch_id=2), timeout=DEADLINE)
        done = threading.Event()
        waiting.add_done_callback(lambda f: done.set())
        assert waiting.result().header.batch_id == 1
        assert opener.result().header.batch_id == 2
        assert done.wait(DEADLINE)
    assert sorted((e.direction, e.batch_id) for e in rec.events) == [
        ("request", 1),
        ("request", 2),
        ("response", 1),
        ("response", 2),
    ]


@pytest.mark.parametrize("binding", BINDINGS)
def test_client_errors_pass_through_unchanged(plain_server: str, binding: str) -> None:
    rec = Recorder()
    channel, stub = client_stub(plain_server, Chain([rec]), binding)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            stub.ExchangeEmbeddings(embeddings(step=-1), timeout=DEADLINE)
        future = stub.ExchangeEmbeddings.future(embeddings(step=-1), timeout=DEADLINE)
        error = future.exception()
    assert (
        info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        and info.value.details() == "step -1 is stale"
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert [e.direction for e in rec.events] == ["request", "request"]


@pytest.mark.parametrize("binding", BINDINGS)
def test_client_refusals_become_rpc_errors(active: EchoActive, plain_server: str, binding: str) -> None:
    def refuse(direction: str) -> object:
        def mod(event: WireEvent) -> None:
            if event.direction == direction:
                raise Refused(f"no {direction}s today", grpc.StatusCode.FAILED_PRECONDITION)

        return mod

    channel, stub = client_stub(plain_server, Chain([refuse("request")]), binding)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.ExchangeEmbeddings(embeddings(), timeout=DEADLINE)
    assert (
        info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        and "no requests today" in info.value.details()
    )
    assert active.received == []  # never sent

    channel, stub = client_stub(plain_server, Chain([refuse("response")]), binding)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            stub.ExchangeEmbeddings(embeddings(), timeout=DEADLINE)
        future = stub.ExchangeEmbeddings.future(embeddings(), timeout=DEADLINE)
        with pytest.raises(grpc.RpcError):
            future.result()
    assert (
        info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        and "no responses today" in info.value.details()
    )
    assert future.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(active.received) == 2  # sent, answered, and the answer refused locally


def test_empty_chain_leaves_the_channel_alone(plain_server: str) -> None:
    channel = grpc.insecure_channel(plain_server)
    assert intercept_channel(channel, Chain(), "p", plain_server) is channel
    intercepted = grpc.intercept_channel(channel, ClientChainInterceptor(Chain(), "p", plain_server))
    with channel:
        reply = services_pb2_grpc.ActiveStub(intercepted).ExchangeEmbeddings(embeddings(), timeout=DEADLINE)
    np.testing.assert_array_equal(values_of(reply), values_of(embeddings()))


@pytest.mark.filterwarnings("ignore:generating an INSECURE")
def test_event_decodes_ciphertexts_with_the_receivers_public_key() -> None:
    from vflnet.crypto.cipher import generate_keypair
    from vflnet.crypto.wire import cipher_to_proto

    public, private = generate_keypair(512, allow_insecure=True)
    values = np.array([[0.5, -1.25], [2.0, 0.0]])
    msg = messages_pb2.Embeddings(header=embeddings().header, cipher=cipher_to_proto(public.encrypt(values)))
    event = WireEvent("request", "server", EXCHANGE, "active", "peer", msg)
    decoded = event.ciphertexts(public)
    assert list(decoded) == ["cipher"]
    np.testing.assert_allclose(private.decrypt(decoded["cipher"]), values)
    other, _ = generate_keypair(512, allow_insecure=True)
    with pytest.raises(ValueError, match="key_id"):
        event.ciphertexts(other)


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_buggy_response_mod_surfaces_its_own_exception(plain_server: str, binding: str) -> None:
    def buggy(event: WireEvent) -> None:
        if event.direction == "response":
            raise ZeroDivisionError("bug in a tap")

    channel, stub = client_stub(plain_server, Chain([buggy]), binding)
    with channel:
        with pytest.raises(ZeroDivisionError, match="bug in a tap"):
            stub.ExchangeEmbeddings(embeddings(), timeout=DEADLINE)
        future = stub.ExchangeEmbeddings.future(embeddings(), timeout=DEADLINE)
        assert isinstance(future.exception(), ZeroDivisionError)
        assert future.code() == grpc.StatusCode.UNKNOWN


# ---------------------------------------------------------------------------------------- wire bytes
def out_of_field_order(msg: messages_pb2.Embeddings) -> bytes:
    """``msg``'s bytes with its fields in reverse order: a valid message that protobuf would never
    write, so that bytes taken from the wire and a new serialization tell apart."""
    parts = []
    for fd, _ in msg.ListFields():
        single = type(msg)()
        getattr(single, fd.name).MergeFrom(getattr(msg, fd.name))
        parts.append(single.SerializeToString())
    data = b"".join(reversed(parts))
    assert data != msg.SerializeToString() and type(msg).FromString(data) == msg
    return data


def test_a_party_hook_gives_its_mods_the_bytes_on_the_wire(active: EchoActive) -> None:
    """A party's server and channel hand each event the message's bytes as they crossed the wire (a
    trace records those, not a second serialization); a mod after a rewrite gets no bytes (they
    would be the old message's), and what is sent is the rewritten message."""
    server_seen = Recorder()
    server, address = start_server(active, Chain([server_seen]), "hook")
    msg = embeddings(step=2)
    wire = out_of_field_order(msg)
    try:
        with grpc.insecure_channel(address) as channel:
            raw = channel.unary_unary(EXCHANGE, request_serializer=bytes, response_deserializer=bytes)
            reply_bytes = raw(wire, timeout=DEADLINE)
        client_seen, after = Recorder(), Recorder()
        chain = Chain([client_seen, scale_values(2.0, messages_pb2.Embeddings), after])
        channel, stub = client_stub(address, chain, "hook")
        with channel:
            stub.ExchangeEmbeddings(msg, timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    request, response = server_seen.events[:2]
    assert request.data == wire and request.message == msg  # exactly what arrived
    assert response.data == reply_bytes  # exactly what left
    sent, got = client_seen.events
    assert sent.data == msg.SerializeToString() and got.data is not None
    assert got.message == messages_pb2.EmbeddingGradients.FromString(got.data)
    rewritten = after.events[0]
    assert rewritten.data is None and rewritten.serialized() == rewritten.message.SerializeToString()
    assert server_seen.events[2].data == rewritten.message.SerializeToString()  # the rewrite went out
    np.testing.assert_allclose(values_of(active.received[1]), values_of(msg) * 2, rtol=1e-6)


def test_undecodable_bytes_reach_no_mod_and_get_invalid_argument(active: EchoActive) -> None:
    """Bytes that are not the method's message are refused before any mod sees them (a tap expects a
    message), and the server keeps serving."""
    seen = Recorder()
    server, address = start_server(active, Chain([seen]), "hook")
    try:
        with grpc.insecure_channel(address) as channel:
            raw = channel.unary_unary(EXCHANGE, request_serializer=bytes, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as info:
                raw(b"\xff\xff\xff\xff", timeout=DEADLINE)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not decode" in info.value.details()
            services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(embeddings(), timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    assert [e.direction for e in seen.events] == ["request", "response"]
