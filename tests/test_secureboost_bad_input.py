"""secureboost bad input: a passive party answers malformed or hostile label-holder requests with a
clear gRPC status and keeps serving; the label holder fails its step with DATA_LOSS naming the party
when a histogram is malformed (the coordinator then stops the run). Real gRPC servers on loopback; the
test plays the other side."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from tests.test_secureboost import tree_config
from vflnet.crypto import generate_keypair
from vflnet.crypto.wire import cipher_to_proto
from vflnet.data.datasets import load_dataset
from vflnet.interceptors.bridge import GrpcBridge, add_handlers, unary
from vflnet.interceptors.chain import Chain
from vflnet.models.secureboost import FRAC_BITS, grad_hess
from vflnet.protocols.secureboost import HISTOGRAMS, ROUTE, SPLIT, START
from vflnet.roles.party import PartyHost
from vflnet.threat.knowledge import run_split
from vflnet.v1 import messages_pb2, secureboost_pb2, services_pb2_grpc
from vflnet.validation import config_from_dict
from vflnet.wire import tensors

DEADLINE = 30


def _serve(cfg, name, tmp_path, reply):
    bridge = GrpcBridge(cfg.transport)
    party = PartyHost(cfg, name, tmp_path / name, bridge)
    party.prepare(reply)
    server = bridge.make_server(name, party.interception.chain)
    party.add_services(server)
    address = bridge.bind(server, name, "127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=DEADLINE)
    return party, server, channel


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    data = tree_config("he", n=300)
    data["transport"] = {"rpc_timeout_s": 5}
    cfg = config_from_dict(data)
    train, test = run_split(cfg, load_dataset(cfg.data.dataset, cfg.data.params))
    return cfg, messages_pb2.JoinReply(run_id=cfg.run.id, train_ids=train, test_ids=test), train


@pytest.fixture
def passive(setting, tmp_path):
    cfg, reply, train = setting
    party, server, channel = _serve(cfg, "passive-1", tmp_path, reply)
    yield channel, train
    channel.close()
    server.stop(0)


def _h(step=1):
    return messages_pb2.Header(run_id="secureboost-he", sender="active", step=step, phase=messages_pb2.TRAIN)


def _start(ids, public, values=None, key_json=None):
    values = grad_hess(np.zeros(len(ids), np.int64), np.zeros((len(ids), 10))) if values is None else values
    ca = public.encrypt(values / float(1 << FRAC_BITS), FRAC_BITS, slots=20)
    return secureboost_pb2.TreeStart(
        header=_h(),
        sample_ids=ids,
        public_key=json.dumps((key_json or public).to_json()).encode(),
        cipher=cipher_to_proto(ca),
    )


def _code(call, req):
    with pytest.raises(grpc.RpcError) as err:
        call(req, timeout=DEADLINE)
    return err.value.code(), err.value.details()


def test_a_passive_party_refuses_bad_requests_and_keeps_serving(passive) -> None:
    channel, train = passive
    ids = train[:40]
    public, _ = generate_keypair(1024)
    other, _ = generate_keypair(1024)
    start, hist = unary(channel, START), unary(channel, HISTOGRAMS)
    split, route = unary(channel, SPLIT), unary(channel, ROUTE)
    # histograms before any tree
    code, text = _code(
        hist,
        secureboost_pb2.HistogramRequest(
            header=_h(), node_of=tensors.to_proto(np.zeros(40, np.int64)), nodes=[0]
        ),
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no tree" in text
    # a ciphertext under another key than the one announced
    bad = _start(ids, public)
    bad.cipher.CopyFrom(_start(ids, other).cipher)
    code, text = _code(start, bad)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "key_id" in text
    # unknown sample ids
    code, text = _code(start, _start(np.array([10**9]), public))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # the real tree start is accepted, and the key is pinned for the run
    start(_start(ids, public), timeout=DEADLINE)
    code, text = _code(start, _start(ids, other))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "key changed" in text
    # a node assignment of the wrong size
    code, text = _code(
        hist,
        secureboost_pb2.HistogramRequest(
            header=_h(), node_of=tensors.to_proto(np.zeros(39, np.int64)), nodes=[0]
        ),
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "shape" in text
    ok = hist(
        secureboost_pb2.HistogramRequest(
            header=_h(), node_of=tensors.to_proto(np.zeros(40, np.int64)), nodes=[0]
        ),
        timeout=DEADLINE,
    )
    assert ok.cipher.key_id == public.key_id
    # a split candidate that does not exist, a node that is not open
    code, text = _code(split, secureboost_pb2.SplitRequest(header=_h(), node=0, candidate=10**6))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown split candidate" in text
    code, _ = _code(split, secureboost_pb2.SplitRequest(header=_h(), node=5, candidate=0))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    done = split(secureboost_pb2.SplitRequest(header=_h(), node=0, candidate=0), timeout=DEADLINE)
    assert done.split_id == 0
    # prediction: a split id that does not exist
    code, text = _code(route, secureboost_pb2.RouteRequest(header=_h(), sample_ids=ids, split_ids=[0, 7]))
    assert code == grpc.StatusCode.NOT_FOUND and "unknown split id" in text and "7" in text
    bits = route(secureboost_pb2.RouteRequest(header=_h(), sample_ids=ids, split_ids=[0]), timeout=DEADLINE)
    assert tensors.from_proto(bits.go_left).shape == (1, 40)
    # only the label holder may call
    code, _ = _code(
        route,
        secureboost_pb2.RouteRequest(
            header=messages_pb2.Header(run_id="secureboost-he", sender="passive-2"),
            sample_ids=ids,
            split_ids=[0],
        ),
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_a_malformed_histogram_fails_the_label_holders_step_naming_the_party(setting, tmp_path) -> None:
    _, reply, train = setting
    data = tree_config("plain", n=300)
    data["run"]["id"] = reply.run_id
    data["transport"] = {"rpc_timeout_s": 5}
    cfg = config_from_dict(data)
    bridge = GrpcBridge(cfg.transport)
    fake = bridge.make_server("passive-1", Chain([]))

    def histograms(req, context):  # a hostile passive party: sums of the wrong size
        return secureboost_pb2.HistogramReply(
            header=req.header, candidates=[3], plain=tensors.to_proto(np.zeros((1, 2, 20), np.int64))
        )

    def start(req, context):
        return secureboost_pb2.TreeStartAck(header=req.header)

    add_handlers(fake, {START: start, HISTOGRAMS: histograms})
    fake_address = bridge.bind(fake, "passive-1", "127.0.0.1:0")
    fake.start()
    roster = [
        messages_pb2.PartyInfo(name=n, role="passive", address=fake_address)
        for n in ("passive-1", "passive-2")
    ]
    joined = messages_pb2.JoinReply()
    joined.CopyFrom(reply)
    joined.roster.extend(roster)
    active, server, channel = _serve(cfg, "active", tmp_path, joined)
    try:
        cmd = messages_pb2.StepCommand(
            header=messages_pb2.Header(
                run_id=cfg.run.id, sender="coordinator", step=1, phase=messages_pb2.TRAIN
            ),
            sample_ids=train,
        )
        code, text = _code(services_pb2_grpc.PartyStub(channel).RunStep, cmd)
        assert code == grpc.StatusCode.DATA_LOSS and "malformed histograms from passive-1" in text
    finally:
        channel.close()
        server.stop(0)
        fake.stop(0)
