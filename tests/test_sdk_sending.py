"""`sdk.send` and `sdk.call` over a real gRPC server: the same checks, metering and failure status,
whether the reply is waited for through a future or by one blocking call."""

from __future__ import annotations

from concurrent import futures
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from vflnet.config import TransportConfig
from vflnet.sdk import call, send
from vflnet.v1 import messages_pb2
from vflnet.wire.errors import RpcFailure
from vflnet.wire.meter import Meter

EXCHANGE = "/vflnet.v1.Active/ExchangeEmbeddings"


def _reply(request: bytes, context: grpc.ServicerContext) -> bytes:
    msg = messages_pb2.Embeddings.FromString(request)
    if msg.header.step == 13:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "step 13 is out of order")
    return messages_pb2.EmbeddingGradients(
        header=messages_pb2.Header(step=msg.header.step)
    ).SerializeToString()


@pytest.fixture
def channel():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(_reply)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("vflnet.v1.Active", {"ExchangeEmbeddings": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield ch
    ch.close()
    server.stop(grace=None).wait()


def _host() -> Any:
    return SimpleNamespace(
        name="passive-1",
        cfg=SimpleNamespace(transport=TransportConfig()),
        meter=Meter(),
        step_deadline_s=30.0,
    )


WAYS = {
    "send": lambda host, ch, msg: send(host, ch, "active", EXCHANGE, msg).result(),
    "call": lambda host, ch, msg: call(host, ch, "active", EXCHANGE, msg),
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_reply_comes_back_and_the_request_is_metered(channel, way):
    host = _host()
    msg = messages_pb2.Embeddings(header=messages_pb2.Header(step=4), sample_ids=[1, 2, 3])
    reply = WAYS[way](host, channel, msg)
    assert isinstance(reply, messages_pb2.EmbeddingGradients) and reply.header.step == 4
    sent, _ = host.meter.take()
    assert sent == {"ExchangeEmbeddings": msg.ByteSize() + 5}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_refused_call_is_a_status_naming_the_peer_and_the_method(channel, way):
    with pytest.raises(RpcFailure) as failed:
        WAYS[way](_host(), channel, messages_pb2.Embeddings(header=messages_pb2.Header(step=13)))
    assert failed.value.code == grpc.StatusCode.ABORTED
    assert failed.value.message.startswith("active refused ExchangeEmbeddings:")
    assert "step 13 is out of order" in failed.value.message


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_request_over_the_payload_limit_never_leaves(channel, way):
    host = _host()
    host.cfg.transport = TransportConfig(max_payload_mb=0.001)
    msg = messages_pb2.Embeddings(header=messages_pb2.Header(step=1), sample_ids=list(range(2000)))
    with pytest.raises(Exception, match="ExchangeEmbeddings to active"):
        WAYS[way](host, channel, msg)
    assert host.meter.take() == ({}, {})
