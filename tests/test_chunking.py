"""Messages over transport.max_message_mb travel in chunks (vflnet/wire/chunking.py): on real gRPC
servers and channels as the roles build them (make_server / open_channel), and in real clusters."""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from tests.conftest import base_config, tls_in, write_config
from vflnet.config import TransportConfig
from vflnet.interceptors import Chain, WireEvent, read_trace
from vflnet.interceptors.bridge import allow_step_deadline, unary
from vflnet.interceptors.grpc_adapters import ClientChainHook, ServerChainHook
from vflnet.registry import PROTOCOLS
from vflnet.runner.local import run_local
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire import tensors, tls
from vflnet.wire.channels import bind, grpc_options, make_server, open_channel
from vflnet.wire.chunking import (
    CALL_METHOD,
    FETCH_METHOD,
    MAX_CACHED_CALLABLES,
    METHOD_KEY,
    TICKET_KEY,
    _ChunkingCall,
)

EXCHANGE = "/vflnet.v1.Active/ExchangeEmbeddings"
SMALL = TransportConfig(
    max_message_mb=0.01, max_payload_mb=0.2
)  # 10 KiB per gRPC message, 200 KiB per message
LIMIT = int(SMALL.max_message_mb * 1024 * 1024)
DEADLINE = 10.0


def embeddings(n: int, dim: int, step: int = 1) -> messages_pb2.Embeddings:
    values = np.random.default_rng(step).normal(size=(n, dim)).astype(np.float32)
    return messages_pb2.Embeddings(
        header=messages_pb2.Header(run_id="r1", step=step, sender="passive-1", phase=messages_pb2.TRAIN),
        sample_ids=list(range(n)),
        values=tensors.to_proto(values),
    )


class Active(services_pb2_grpc.ActiveServicer):
    """Answers embeddings with themselves as "gradients", each row repeated ``repeat`` times."""

    def __init__(self) -> None:
        self.received: list[messages_pb2.Embeddings] = []
        self.repeat = 1
        self.gate: threading.Event | None = None  # set: the reply waits for it (at most DEADLINE)
        self.gated: queue.Queue[threading.Event] = queue.Queue()  # per gated call: set when it ends
        self.refuse = False  # answer INVALID_ARGUMENT

    def ExchangeEmbeddings(  # noqa: N802 - gRPC's name
        self, request: messages_pb2.Embeddings, context: grpc.ServicerContext
    ) -> messages_pb2.EmbeddingGradients:
        self.received.append(request)
        if self.gate is not None:
            ended = threading.Event()
            context.add_callback(ended.set)
            self.gated.put(ended)
            self.gate.wait(DEADLINE)
        if self.refuse:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused by the test")
        context.set_trailing_metadata((("vflnet-test", "served"),))  # a parked reply's ticket replaces it
        grads = np.repeat(tensors.from_proto(request.values), self.repeat, axis=0)
        return messages_pb2.EmbeddingGradients(header=request.header, values=tensors.to_proto(grads))


class Recorder:
    def __init__(self) -> None:
        self.events: list[WireEvent] = []

    def __call__(self, event: WireEvent) -> None:
        self.events.append(event)


def double_gradients(event: WireEvent) -> messages_pb2.EmbeddingGradients | None:
    """A rewrite on whole replies: the gradients times two."""
    if event.direction != "response":
        return None
    out = messages_pb2.EmbeddingGradients()
    out.CopyFrom(event.message)
    out.values.CopyFrom(tensors.to_proto(event.tensors()["values"] * 2))
    return out


def serve(
    active: Active, transport: TransportConfig, name: str = "active", chain: Chain | None = None
) -> tuple[grpc.Server, str]:
    hook = ServerChainHook(chain, name) if chain else None  # as a party's server carries its chain
    server = make_server(transport, name, max_workers=8, hook=hook)
    services_pb2_grpc.add_ActiveServicer_to_server(active, server)
    port = bind(server, "127.0.0.1:0", transport, name)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def active() -> Active:
    return Active()


@pytest.fixture
def server(active: Active) -> Iterator[str]:
    srv, address = serve(active, SMALL)
    yield address
    srv.stop(grace=0)


def raw_channel(address: str) -> grpc.Channel:
    """A channel with the same size limits but no chunking."""
    return grpc.insecure_channel(address, options=grpc_options(SMALL))


def status(fn, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    try:
        fn(*args, timeout=DEADLINE, **kwargs)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def test_an_oversized_exchange_travels_in_chunks_and_mods_see_whole_messages(active: Active) -> None:
    server_rec, client_rec = Recorder(), Recorder()
    srv, address = serve(active, SMALL, chain=Chain([server_rec, double_gradients]))
    msg = embeddings(n=100, dim=100)  # 40 KB: four chunks
    assert msg.ByteSize() > LIMIT
    try:
        with raw_channel(address) as raw:  # as one gRPC message it cannot travel
            code, details = status(services_pb2_grpc.ActiveStub(raw).ExchangeEmbeddings, msg)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        hook = ClientChainHook(Chain([client_rec]), "passive-1", address)
        channel = open_channel(address, SMALL, "passive-1", hook=hook)
        stub = services_pb2_grpc.ActiveStub(channel)
        expected = tensors.from_proto(msg.values) * 2
        np.testing.assert_array_equal(
            tensors.from_proto(stub.ExchangeEmbeddings(msg, timeout=DEADLINE).values), expected
        )
        np.testing.assert_array_equal(
            tensors.from_proto(stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE).result().values),
            expected,
        )
        channel.close()
    finally:
        srv.stop(grace=0)
    assert active.received == [msg, msg]  # the servicer got the whole message, twice
    for rec, side in ((server_rec, "server"), (client_rec, "client")):
        assert [(e.side, e.method, e.direction) for e in rec.events] == [
            (side, EXCHANGE, d) for d in ("request", "response")
        ] * 2
        assert all(e.message == msg for e in rec.events if e.direction == "request")
    # the client's tap sees the reply as the server's rewrite left it: whole and doubled
    np.testing.assert_array_equal(client_rec.events[1].tensors()["values"], expected)


def test_a_channel_builds_one_callable_per_method_and_every_call_and_thread_shares_it(
    active: Active, server: str
) -> None:
    """Issue 40: building a method's callable for each call built three gRPC callables, on every
    step's path. The channel keeps one per method, shared by calls on several threads at once, and
    keeps no more than its bound when a caller passes new serializer functions each time."""
    channel = open_channel(server, SMALL, "passive-1")
    try:
        first, again = unary(channel, EXCHANGE), unary(channel, EXCHANGE)
        assert first is again
        msgs = [embeddings(n=10, dim=100, step=s) for s in range(1, 17)]  # 4 KB: one gRPC message each
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda m: unary(channel, EXCHANGE)(m, timeout=DEADLINE), msgs))
        for msg, reply in zip(msgs, replies, strict=True):
            np.testing.assert_array_equal(tensors.from_proto(reply.values), tensors.from_proto(msg.values))
        for _ in range(MAX_CACHED_CALLABLES + 10):
            fresh = channel.unary_unary(
                EXCHANGE, lambda m: m.SerializeToString(), messages_pb2.EmbeddingGradients.FromString
            )
            assert fresh is not first
        assert len(channel._callables) == MAX_CACHED_CALLABLES
        assert unary(channel, EXCHANGE) is first
    finally:
        channel.close()


def test_a_large_reply_to_a_small_request_is_fetched_once_by_ticket(active: Active, server: str) -> None:
    active.repeat = 100  # 20 rows of 50 floats in, 2000 rows out: 400 KB... over the 200 KiB ceiling
    code, details = status(
        services_pb2_grpc.ActiveStub(open_channel(server, SMALL, "p")).ExchangeEmbeddings, embeddings(20, 50)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "transport.max_payload_mb" in details
    active.repeat = 20  # 400 rows out: 80 KB
    msg = embeddings(n=20, dim=50)
    assert msg.ByteSize() < LIMIT
    expected = np.repeat(tensors.from_proto(msg.values), 20, axis=0)
    with raw_channel(server) as raw:  # without chunking: the reply is parked under a ticket
        call = services_pb2_grpc.ActiveStub(raw).ExchangeEmbeddings.future(msg, timeout=DEADLINE)
        assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and FETCH_METHOD in call.details()
        ticket = dict(call.trailing_metadata())[TICKET_KEY]
        fetch = raw.unary_stream(
            FETCH_METHOD, messages_pb2.ReplyTicket.SerializeToString, messages_pb2.Chunk.FromString
        )
        chunks = list(fetch(messages_pb2.ReplyTicket(token=ticket), timeout=DEADLINE))
        assert len(chunks) > 1 and all(c.ByteSize() <= LIMIT for c in chunks)
        reply = messages_pb2.EmbeddingGradients.FromString(b"".join(c.data for c in chunks))
        np.testing.assert_array_equal(tensors.from_proto(reply.values), expected)
        code, _ = status(lambda **kw: list(fetch(messages_pb2.ReplyTicket(token=ticket), **kw)))
        assert code == grpc.StatusCode.NOT_FOUND  # one fetch per ticket
    client_rec = Recorder()  # the chunking channel fetches on its own; its tap sees each whole reply once
    hook = ClientChainHook(Chain([client_rec]), "passive-1", server)
    with open_channel(server, SMALL, "passive-1", hook=hook) as channel:
        stub = services_pb2_grpc.ActiveStub(channel)
        np.testing.assert_array_equal(
            tensors.from_proto(stub.ExchangeEmbeddings(msg, timeout=DEADLINE).values), expected
        )
        np.testing.assert_array_equal(
            tensors.from_proto(stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE).result().values),
            expected,
        )
    assert [e.direction for e in client_rec.events] == ["request", "response"] * 2
    for event in client_rec.events[1::2]:
        np.testing.assert_array_equal(event.tensors()["values"], expected)


@pytest.mark.parametrize(
    ("rows", "repeat"),
    [(4, 1), (100, 1), (20, 20)],
    ids=["one message", "chunked request", "parked reply"],
)
def test_a_future_settles_once_with_its_reply_status_or_cancellation(
    active: Active, server: str, rows: int, repeat: int
) -> None:
    """future() through the chunking channel, in each of its three paths (gRPC's own future, a
    chunked call on a thread, a parked reply fetched on a thread): callbacks see the settled future
    once, a refused call carries the server's status, and cancel() settles the future at once with
    CANCELLED, as a loopback call's cancel() does, and ends the gRPC call in flight."""
    msg = embeddings(n=rows, dim=50)
    expected = np.repeat(tensors.from_proto(msg.values), repeat, axis=0)
    active.repeat = repeat
    with open_channel(server, SMALL, "passive-1") as channel:
        stub = services_pb2_grpc.ActiveStub(channel)
        seen: list[grpc.Future] = []
        settled = threading.Event()
        future = stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE)
        future.add_done_callback(lambda f: (seen.append(f), settled.set()))
        np.testing.assert_array_equal(tensors.from_proto(future.result().values), expected)
        assert settled.wait(DEADLINE) and seen == [future]
        assert future.done() and not future.cancelled() and future.code() == grpc.StatusCode.OK
        # the status and trailer of the gRPC call that brought the reply (a ticket's fetch has none)
        assert (("vflnet-test", "served") in future.trailing_metadata()) == (repeat == 1)
        future.add_done_callback(seen.append)  # on a settled future: at once
        assert seen == [future, future]

        active.refuse = True
        refused = stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE)
        assert refused.exception(timeout=DEADLINE).code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.details() == "refused by the test"
        with pytest.raises(grpc.RpcError):
            refused.result()

        active.refuse, active.gate = False, threading.Event()
        waiting = stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE)
        ended = active.gated.get(timeout=DEADLINE)  # the servicer has the call
        cancelled: list[grpc.Future] = []
        waiting.add_done_callback(cancelled.append)
        assert waiting.cancel() and waiting.cancelled() and waiting.done()
        assert cancelled == [waiting]  # the callbacks ran once, at once
        with pytest.raises(grpc.RpcError) as info:
            waiting.result(timeout=DEADLINE)
        assert info.value is waiting.exception() and waiting.code() == grpc.StatusCode.CANCELLED
        assert not waiting.cancel()  # settled: nothing left to cancel
        assert ended.wait(DEADLINE / 2)  # the server saw the call end before its reply was let go
        assert cancelled == [waiting]
        active.gate.set()
        active.gate = None
        # the server keeps serving
        again = stub.ExchangeEmbeddings.future(msg, timeout=DEADLINE)
        np.testing.assert_array_equal(tensors.from_proto(again.result().values), expected)


def test_a_gRPC_call_begun_after_cancel_is_cancelled_at_once(active: Active, server: str) -> None:
    """As a parked reply's fetch that starts after the future was cancelled (its ticket call had
    ended): the future does not wait on it, and the call ends."""
    future = _ChunkingCall()
    assert future.cancel() and future.cancelled()
    active.gate = threading.Event()
    with raw_channel(server) as raw:
        call = services_pb2_grpc.ActiveStub(raw).ExchangeEmbeddings.future(
            embeddings(4, 50), timeout=DEADLINE
        )
        future.track(call)
        assert call.cancelled() and call.code() == grpc.StatusCode.CANCELLED
        assert future.code() == grpc.StatusCode.CANCELLED  # the future's own status, unchanged
    active.gate.set()


def test_malformed_chunk_streams_get_an_error_status_and_the_server_keeps_serving(
    active: Active, server: str
) -> None:
    data = embeddings(n=30, dim=30).SerializeToString()
    third = len(data) // 3 + 1
    parts = [data[i * third : (i + 1) * third] for i in range(3)]

    def chunks(*spec: tuple[bytes, int, int]) -> list[messages_pb2.Chunk]:
        return [messages_pb2.Chunk(data=d, index=i, count=c) for d, i, c in spec]

    cases = {
        "out of order": (
            EXCHANGE,
            chunks((parts[1], 1, 3), (parts[0], 0, 3), (parts[2], 2, 3)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected chunk 0",
        ),
        "incomplete": (
            EXCHANGE,
            chunks((parts[0], 0, 3), (parts[1], 1, 3)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ended after 2 of 3",
        ),
        "count changes": (
            EXCHANGE,
            chunks((parts[0], 0, 3), (parts[1], 1, 2)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected chunk 1 of 3",
        ),
        "empty stream": (EXCHANGE, [], grpc.StatusCode.INVALID_ARGUMENT, "ended after 0"),
        "not a message": (
            EXCHANGE,
            chunks((b"\xff" * 50, 0, 1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "does not decode",
        ),
        "over the ceiling": (
            EXCHANGE,
            chunks(*[(b"x" * 10000, i, 30) for i in range(30)]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "transport.max_payload_mb",
        ),
        "unknown method": ("/vflnet.v1.Active/Nope", chunks((data, 0, 1)), grpc.StatusCode.UNIMPLEMENTED, ""),
    }
    with raw_channel(server) as raw:
        call = raw.stream_stream(
            CALL_METHOD, messages_pb2.Chunk.SerializeToString, messages_pb2.Chunk.FromString
        )
        for what, (method, stream, expected_code, text) in cases.items():
            code, details = status(
                lambda s=stream, m=method, **kw: list(call(iter(s), metadata=((METHOD_KEY, m),), **kw))
            )
            assert code == expected_code and text in details, (what, code, details)
    assert active.received == []  # nothing malformed reached the servicer
    with open_channel(server, SMALL, "passive-1") as channel:  # and it still serves, chunked or not
        stub = services_pb2_grpc.ActiveStub(channel)
        for msg in (embeddings(n=30, dim=100), embeddings(n=2, dim=2)):
            assert stub.ExchangeEmbeddings(msg, timeout=DEADLINE).values == msg.values
        code, details = status(stub.ExchangeEmbeddings, embeddings(n=300, dim=300))  # refused before sending
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "transport.max_payload_mb" in details
    assert len(active.received) == 2


@pytest.mark.parametrize("rows", [100, 4], ids=["chunked", "one message"])
def test_a_call_is_authorized_as_the_method_it_carries_before_a_mod_sees_it(
    tmp_path: Path, active: Active, rows: int
) -> None:
    PROTOCOLS.get("split")  # its contract lets passive parties call ExchangeEmbeddings, as in a run
    tls.make_ca(tmp_path)
    for name, role in (("active", "active"), ("passive-1", "passive"), ("coordinator", "coordinator")):
        tls.issue_party_cert(tmp_path, name, role)
    transport = dataclasses.replace(
        SMALL,
        tls=tls_in(tmp_path),
    )
    rec = Recorder()
    srv, address = serve(active, transport, chain=Chain([rec]))
    msg = embeddings(n=rows, dim=100)
    assert (msg.ByteSize() > LIMIT) == (rows == 100)
    try:
        with open_channel(address, transport, "coordinator") as channel:
            code, details = status(services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings, msg)
        assert code == grpc.StatusCode.PERMISSION_DENIED and EXCHANGE in details and "coordinator" in details
        assert active.received == [] and rec.events == []
        with open_channel(address, transport, "passive-1") as channel:
            assert (
                services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE).values
                == msg.values
            )
    finally:
        srv.stop(grace=0)
    assert active.received == [msg] and [e.direction for e in rec.events] == ["request", "response"]


def _split_he_config(limit_mb: float | None) -> dict:
    data = base_config(n_passive=1, aggregation="sum", active_features=True)
    data["data"]["test_fraction"] = 0.05  # 90 test samples: one evaluation step
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    for p in data["parties"][1:]:
        p["bottom"] = {"kind": "mlp", "hidden": [6], "out": 10}
    data["train"].update(
        batch_size=16, max_steps=2, optimizer={"kind": "sgd", "lr": 0.5}, eval_batch_size=512
    )
    if limit_mb is not None:
        data["transport"]["max_message_mb"] = limit_mb
        data["parties"][1]["via"] = "proxy"  # every call to the active party crosses a gRPC proxy
        data["trace"] = {"parties": ["passive-1"]}
    return data


def _parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted((run_dir / "checkpoints").glob("*.pt")):
        for module, state in torch.load(path)["modules"].items():
            out.update({f"{path.stem}/{module}/{k}": v for k, v in state.items()})
    return out


@pytest.mark.e2e
@pytest.mark.slow
def test_split_he_with_a_small_limit_through_a_proxy_ends_with_the_default_runs_parameters(
    tmp_path: Path,
) -> None:
    limit_mb = 0.003  # a training batch's packed encrypted embeddings are 4 KB, the test batch's 23 KB
    small = write_config(tmp_path, _split_he_config(limit_mb), "small.yaml")
    default = write_config(tmp_path, _split_he_config(None), "default.yaml")
    assert run_local(small, run_dir=tmp_path / "small", progress=False) == 0
    assert run_local(default, run_dir=tmp_path / "default", progress=False) == 0
    got, want = _parameters(tmp_path / "small"), _parameters(tmp_path / "default")
    assert len(got) == 8 and got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in got)  # bit for bit
    limit = int(limit_mb * 1024 * 1024)
    for trace in ("passive-1", "proxy-active"):  # the passive party's own tap and the proxy's
        sent = [
            e.message
            for e in read_trace(tmp_path / "small/traces" / f"{trace}.trace")
            if e.short_method == "ExchangeEmbeddings" and e.direction == "request" and e.sender == "passive-1"
        ]
        assert [len(m.sample_ids) for m in sent] == [16, 16, 90]  # two training steps, one evaluation
        assert all(m.ByteSize() > limit and list(m.cipher.shape) == [len(m.sample_ids), 10] for m in sent)
    summary = json.loads((tmp_path / "small/summary.json").read_text())
    assert summary["steps"] == 2


def test_a_chunked_stream_needs_a_deadline_and_fits_the_inflight_budget(active: Active) -> None:
    """Security finding 4: 50 chunked streams that never finish each buffered up to the payload cap and
    held a worker without end (a party went from 516 to 935 MB and the run failed)."""
    transport = dataclasses.replace(SMALL, max_inflight_mb=0.05)  # ~52 KB over all streams
    srv, address = serve(active, transport)
    raw = raw_channel(address)  # closed below: no gRPC thread may outlive a test (later tests fork)
    try:
        call = raw.stream_stream(
            CALL_METHOD, messages_pb2.Chunk.SerializeToString, messages_pb2.Chunk.FromString
        )
        one = [messages_pb2.Chunk(data=embeddings(n=2, dim=2).SerializeToString(), index=0, count=1)]
        with pytest.raises(grpc.RpcError) as info:  # no deadline: refused before a chunk is read
            list(call(iter(one), metadata=((METHOD_KEY, EXCHANGE),)))
        assert (
            info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "needs a deadline" in info.value.details()
        )
        big = [messages_pb2.Chunk(data=b"x" * 10000, index=i, count=10) for i in range(10)]  # 100 KB
        code, details = status(lambda **kw: list(call(iter(big), metadata=((METHOD_KEY, EXCHANGE),), **kw)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "transport.max_inflight_mb" in details
        # the refused stream gave its bytes back: a whole message still fits
        with open_channel(address, transport, "passive-1") as channel:
            msg = embeddings(n=30, dim=100)  # ~12 KB: two chunks
            assert (
                services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE).values
                == msg.values
            )
    finally:
        raw.close()
        srv.stop(grace=0)


def test_a_chunked_call_from_the_wrong_role_is_refused_before_its_stream_is_read(
    tmp_path: Path, active: Active
) -> None:
    """Security finding 4: a chunked RunStep from the wrong role was buffered (8 MiB, 6 s) before any
    role check. The refusal now comes while the caller is still sending."""
    import threading

    tls.make_ca(tmp_path)
    for name, role in (("active", "active"), ("coordinator", "coordinator")):
        tls.issue_party_cert(tmp_path, name, role)
    transport = dataclasses.replace(
        SMALL,
        tls=tls_in(tmp_path),
    )
    srv, address = serve(active, transport)
    release, finished = threading.Event(), threading.Event()

    def never_ending() -> Iterator[messages_pb2.Chunk]:
        yield messages_pb2.Chunk(data=b"x" * 1000, index=0, count=1000)
        release.wait(DEADLINE)  # a stream that would go on; the server must not wait for it
        finished.set()

    try:
        creds = tls.channel_credentials(
            tmp_path / "ca.pem", tmp_path / "coordinator.pem", tmp_path / "coordinator.key"
        )
        with grpc.secure_channel(
            address, creds, options=[("grpc.ssl_target_name_override", "active")]
        ) as channel:
            call = channel.stream_stream(
                CALL_METHOD, messages_pb2.Chunk.SerializeToString, messages_pb2.Chunk.FromString
            )
            with pytest.raises(grpc.RpcError) as info:
                list(call(never_ending(), metadata=((METHOD_KEY, EXCHANGE),), timeout=DEADLINE))
            refused_while_sending = not finished.is_set()
        assert (
            info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "coordinator" in info.value.details()
        )
        assert refused_while_sending
    finally:
        release.set()
        srv.stop(grace=0)


def test_stalled_chunked_streams_hold_only_part_of_the_workers(active: Active) -> None:
    """Security finding 4: streams that never finish held every worker (50 streams: the run failed).
    A server reads at most max_workers // 4 chunked streams at once; other calls keep the rest."""
    import threading

    srv, address = serve(active, SMALL)  # 8 workers: 2 chunked streams at once
    release, first_outcome = threading.Event(), threading.Event()
    outcomes: list[grpc.StatusCode] = []

    def stalled() -> Iterator[messages_pb2.Chunk]:
        yield messages_pb2.Chunk(data=b"x" * 100, index=0, count=5)
        release.wait(DEADLINE)

    raw = raw_channel(address)
    call = raw.stream_stream(CALL_METHOD, messages_pb2.Chunk.SerializeToString, messages_pb2.Chunk.FromString)

    def hold() -> None:
        outcomes.append(
            status(lambda **kw: list(call(stalled(), metadata=((METHOD_KEY, EXCHANGE),), **kw)))[0]
        )
        first_outcome.set()

    streams = [threading.Thread(target=hold) for _ in range(3)]
    try:
        for t in streams:
            t.start()
        # whichever order they arrive in, two are held and the third is refused at once
        assert first_outcome.wait(DEADLINE) and outcomes == [grpc.StatusCode.RESOURCE_EXHAUSTED]
        with open_channel(address, SMALL, "passive-1") as channel:  # a whole unary call is still served
            msg = embeddings(n=2, dim=2)
            assert (
                services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE).values
                == msg.values
            )
        release.set()
        for t in streams:
            t.join(DEADLINE)
        # the held two end as incomplete once their senders stop
        assert sorted(outcomes, key=str) == sorted(
            [grpc.StatusCode.RESOURCE_EXHAUSTED] + [grpc.StatusCode.INVALID_ARGUMENT] * 2, key=str
        )
    finally:
        release.set()
        raw.close()
        srv.stop(grace=0)


def test_a_chunked_stream_whose_sender_goes_quiet_is_dropped(active: Active) -> None:
    """Security finding 4: a stream that stops sending held its worker until its deadline. It is
    dropped after transport.rpc_timeout_s without a chunk, and the server keeps serving."""
    import threading

    transport = dataclasses.replace(SMALL, rpc_timeout_s=2.0)
    srv, address = serve(active, transport)
    release = threading.Event()

    def quiet() -> Iterator[messages_pb2.Chunk]:
        yield messages_pb2.Chunk(data=b"x" * 100, index=0, count=5)
        release.wait(DEADLINE)  # the client's deadline (10 s) is far off; the idle limit is 2 s

    raw = raw_channel(address)
    try:
        call = raw.stream_stream(
            CALL_METHOD, messages_pb2.Chunk.SerializeToString, messages_pb2.Chunk.FromString
        )
        code, details = status(lambda **kw: list(call(quiet(), metadata=((METHOD_KEY, EXCHANGE),), **kw)))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "no chunk for 2 s" in details
        release.set()
        with open_channel(address, transport, "passive-1") as channel:
            msg = embeddings(n=30, dim=100)  # chunked, sent at once: not idle
            assert (
                services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE).values
                == msg.values
            )
    finally:
        release.set()
        raw.close()
        srv.stop(grace=0)


def test_a_chunked_call_may_ask_for_the_runs_step_deadline_once_it_is_known(active: Active) -> None:
    """A step deadline scaled with the work (vflnet/sdk/deadlines.py) can exceed rpc_timeout_s and
    join_timeout_s: once admission announces it, chunked calls may ask for it; before, they may not."""
    transport = dataclasses.replace(SMALL, rpc_timeout_s=5, join_timeout_s=5)  # bound: 10 s
    srv, address = serve(active, transport)
    try:
        with open_channel(address, transport, "passive-1") as channel:
            stub = services_pb2_grpc.ActiveStub(channel)
            msg = embeddings(n=30, dim=100)  # ~12 KB: two chunks
            with pytest.raises(grpc.RpcError) as info:
                stub.ExchangeEmbeddings(msg, timeout=60)
            assert (
                info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                and "needs a deadline of at most 10 s" in info.value.details()
            )
            allow_step_deadline(srv, 100.0)
            assert stub.ExchangeEmbeddings(msg, timeout=60).values == msg.values
    finally:
        srv.stop(grace=0)


class CountingHook(ServerChainHook):
    """A party's server hook that counts the calls it is handed."""

    def __init__(self, chain: Chain, party: str) -> None:
        super().__init__(chain, party)
        self.handed: list[int] = []

    def request(self, method: str, message: Any, peer: str, data: bytes | None = None) -> Any:
        self.handed.append(message.header.step)
        return super().request(method, message, peer, data)


@pytest.mark.parametrize("n", [4, 100], ids=["one message", "chunked"])
def test_a_step_the_chain_skips_is_served_as_without_a_hook(active: Active, n: int) -> None:
    """`vflnet bench goals` times the tap inside one run (a chain gate, tools/bench/tap_ab.py): the
    untapped steps' calls must cost what they cost a party without a chain, so the server never hands
    them to the hook; every call is still served."""
    from vflnet.tools.bench.tap_ab import odd_blocks

    recorder = Recorder()
    hook = CountingHook(Chain([recorder], passes=odd_blocks(1)), "active")
    server = make_server(SMALL, "active", max_workers=8, hook=hook)
    services_pb2_grpc.add_ActiveServicer_to_server(active, server)
    address = f"127.0.0.1:{bind(server, '127.0.0.1:0', SMALL, 'active')}"
    server.start()
    try:
        with open_channel(address, SMALL, "passive-1") as channel:
            stub = services_pb2_grpc.ActiveStub(channel)
            for step in range(4):
                assert stub.ExchangeEmbeddings(embeddings(n, 100, step), timeout=DEADLINE).header.step == step
    finally:
        server.stop(grace=0)
    assert [m.header.step for m in active.received] == [0, 1, 2, 3]
    assert hook.handed == [0, 2]  # steps 1 and 3: an odd block of one step
    assert [(e.direction, e.step) for e in recorder.events] == [
        ("request", 0),
        ("response", 0),
        ("request", 2),
        ("response", 2),
    ]
