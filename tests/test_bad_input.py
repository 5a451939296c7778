"""Malformed or out-of-protocol messages get a clear gRPC status, and the server keeps serving.

The active party runs in-process behind a real gRPC server on loopback; the test plays the
coordinator and the passive parties through real stubs."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from tests.conftest import base_config
from vflnet.data.alignment import intersect, split_train_test
from vflnet.interceptors.bridge import GrpcBridge
from vflnet.roles.party import PartyHost
from vflnet.roles.step_order import STEPS_IN_FLIGHT
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.validation import config_from_dict
from vflnet.wire import tensors

# How long the active party waits for a missing peer (it bounds test_missing_peer_times_out...), and
# the client-side deadline of every call here: generous, the calls only take it when something hangs.
RPC_TIMEOUT_S = 5
DEADLINE = 30


@pytest.fixture
def active(tmp_path, request):
    data = base_config(n_passive=2)
    data["run"]["id"] = "bad-input"
    if getattr(request, "param", "plain") == "traced":  # a mod chain on the server: the party's trace tap
        data["trace"] = {"parties": ["active"]}
    data["transport"]["rpc_timeout_s"] = RPC_TIMEOUT_S
    cfg = config_from_dict(data)
    bridge = GrpcBridge(cfg.transport)
    party = PartyHost(cfg, "active", tmp_path, bridge)
    train, _ = split_train_test(intersect([party.data.ids]), 0.2, cfg.run.seed)
    party.prepare(messages_pb2.JoinReply(run_id=cfg.run.id, train_ids=train))
    server = bridge.make_server("active", party.interception.chain)
    party.add_services(server)
    address = bridge.bind(server, "active", "127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=DEADLINE)
    party.test_channel = channel
    yield party, services_pb2_grpc.ActiveStub(channel), services_pb2_grpc.PartyStub(channel), train
    channel.close()
    server.stop(0)


def _emb(sender="passive-1", step=1, ids=(1, 2, 3), values=None, run_id="bad-input", dim=16):
    values = np.zeros((len(ids), dim), np.float32) if values is None else values
    return messages_pb2.Embeddings(
        header=messages_pb2.Header(run_id=run_id, step=step, sender=sender, phase=messages_pb2.TRAIN),
        sample_ids=list(ids),
        values=tensors.to_proto(values),
    )


def _command(step, ids, phase=messages_pb2.TRAIN):
    return messages_pb2.StepCommand(
        header=messages_pb2.Header(run_id="bad-input", step=step, sender="coordinator", phase=phase),
        sample_ids=list(ids),
    )


def _status(fn, *args):
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, timeout=DEADLINE)
    return info.value.code(), info.value.details()


@pytest.mark.parametrize(
    "msg, code, text",
    [
        (_emb(sender="mallory"), grpc.StatusCode.PERMISSION_DENIED, "unknown party 'mallory'"),
        (_emb(sender="coordinator"), grpc.StatusCode.PERMISSION_DENIED, "role 'coordinator'"),
        (_emb(run_id="other-run"), grpc.StatusCode.PERMISSION_DENIED, "run 'other-run'"),
        (_emb(dim=5), grpc.StatusCode.INVALID_ARGUMENT, "shape (3, 5) where (3, 16)"),
        (
            _emb(values=np.zeros((3, 16), np.float64)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "float32 was expected",
        ),
        (_emb(values=np.full((3, 16), np.nan, np.float32)), grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf"),
    ],
)
def test_bad_embeddings_get_a_status(active, msg, code, text):
    _, stub, _, _ = active
    got_code, details = _status(stub.ExchangeEmbeddings, msg)
    assert got_code == code and text in details


def _full_step(party_stub, active_stub, step, ids):
    """One good step: the coordinator's RunStep plus both passive parties' embeddings."""
    results = {}

    def send(name):
        results[name] = active_stub.ExchangeEmbeddings(
            _emb(sender=name, step=step, ids=ids), timeout=DEADLINE
        )

    threads = [threading.Thread(target=send, args=(n,)) for n in ("passive-1", "passive-2")]
    for t in threads:
        t.start()
    report = party_stub.RunStep(_command(step, ids), timeout=DEADLINE)
    for t in threads:
        t.join(DEADLINE)
    return report, results


def test_server_keeps_serving_after_bad_messages_and_rejects_stale_steps(active):
    party, stub, party_stub, train = active
    ids = train[:4]
    for bad in (_emb(sender="mallory"), _emb(dim=3), _emb(values=np.full((3, 16), np.inf, np.float32))):
        _status(stub.ExchangeEmbeddings, bad)
    report, replies = _full_step(party_stub, stub, 1, ids)
    assert report.metrics["count"] == 4 and party.local.version == 1
    grad = tensors.from_proto(replies["passive-1"].values)
    assert grad.shape == (4, 16) and np.abs(grad).sum() > 0
    # a replay of the finished step is refused
    code, details = _status(stub.ExchangeEmbeddings, _emb(step=1, ids=ids))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "step 1 is not current" in details
    # the same step command again (a retry after a lost reply) gets the stored report; nothing runs twice
    again = party_stub.RunStep(_command(1, ids), timeout=30)
    assert again == report and party.local.version == 1
    # any other command for a finished step is stale
    code, details = _status(party_stub.RunStep, _command(1, ids, phase=messages_pb2.EVAL))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale" in details
    report, _ = _full_step(party_stub, stub, 2, ids)
    assert party.local.version == 2


def test_missing_peer_times_out_with_a_named_party(active):
    party, stub, party_stub, train = active
    ids = train[:4]
    sender = threading.Thread(
        target=lambda: _status(stub.ExchangeEmbeddings, _emb(sender="passive-1", step=1, ids=ids))
    )
    sender.start()
    code, details = _status(party_stub.RunStep, _command(1, ids))
    sender.join(DEADLINE)
    assert code == grpc.StatusCode.ABORTED and "no embeddings from passive-2" in details
    assert party.local.version == 0  # nothing was applied


def test_mismatched_sample_ids_and_unknown_ids_are_refused(active):
    party, stub, party_stub, train = active
    code, details = _status(party_stub.RunStep, _command(1, [10**9]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not held by this party" in details
    ids = train[:4]
    # the refused step changed nothing: step 1 is still the next one
    pending = stub.ExchangeEmbeddings.future(
        _emb(sender="passive-1", step=1, ids=train[4:8]), timeout=DEADLINE
    )
    # the order is fixed: RunStep comes once the active party holds them (its condition is notified
    # whenever embeddings arrive; RunStep waits on the same one)
    with party.side.mailbox.arrived:
        held = party.side.mailbox.arrived.wait_for(
            lambda: "passive-1" in getattr(party.side.mailbox.slots.get(1), "messages", {}), DEADLINE
        )
    assert held, "the active party never stored passive-1's embeddings for step 1"
    code, details = _status(party_stub.RunStep, _command(1, ids))
    # the passive call is released with the failure too (not by its own deadline)
    released = pending.exception(timeout=DEADLINE)
    assert released is not None and released.code() == grpc.StatusCode.ABORTED, released
    assert "other sample ids" in released.details()
    assert code == grpc.StatusCode.ABORTED and "other sample ids" in details


def test_health_service_reports_serving(active):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    party, _, _, _ = active
    reply = health_pb2_grpc.HealthStub(party.test_channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_message_over_the_payload_ceiling_names_the_setting(active):
    """Over max_message_mb a message travels in chunks (tests/test_chunking.py); over max_payload_mb
    it is refused before sending."""
    party, stub, party_stub, train = active
    party.cfg.transport.max_payload_mb = 100 / 1024 / 1024  # 100 bytes: the gradient reply cannot fit
    results = {}

    def send(name):
        results[name] = _status(stub.ExchangeEmbeddings, _emb(sender=name, step=1, ids=train[:4]))

    threads = [threading.Thread(target=send, args=(n,)) for n in ("passive-1", "passive-2")]
    for t in threads:
        t.start()
    code, details = _status(party_stub.RunStep, _command(1, train[:4]))
    for t in threads:
        t.join(DEADLINE)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "transport.max_payload_mb" in details
    assert all(c == grpc.StatusCode.ABORTED and "transport.max_payload_mb" in d for c, d in results.values())


def _shutdown(run_id="bad-input", sender="coordinator"):
    return messages_pb2.ShutdownRequest(run_id=run_id, sender=sender, reason="test", save_checkpoint=True)


@pytest.mark.parametrize(
    "request_, code, text",
    [
        (_shutdown(run_id="other-run"), grpc.StatusCode.PERMISSION_DENIED, "run 'other-run'"),
        (_shutdown(sender="passive-1"), grpc.StatusCode.PERMISSION_DENIED, "role 'passive'"),
        (_shutdown(sender=""), grpc.StatusCode.PERMISSION_DENIED, "unknown party"),
    ],
)
def test_a_refused_shutdown_changes_nothing(active, request_, code, text):
    """Security finding 3: a refused Shutdown used to fail the in-flight steps first."""
    party, stub, party_stub, train = active
    assert _status(party_stub.Shutdown, request_)[0] == code
    assert text in _status(party_stub.Shutdown, request_)[1]
    assert not party.liveness.shutdown.is_set()
    report, _ = _full_step(party_stub, stub, 1, train[:4])  # the run goes on
    assert report.metrics["count"] == 4 and party.local.version == 1


def test_a_step_command_that_overtakes_the_one_before_waits_for_its_turn(active):
    """A pipelined schedule keeps STEPS_IN_FLIGHT step commands out (vflnet/roles/step_order.py): step
    2's may reach the party first, and waits there until step 1 is done; one beyond the window is refused."""
    party, stub, party_stub, train = active
    early = party_stub.RunStep.future(_command(2, train[4:8]), timeout=DEADLINE)
    with party.turns.cond:
        assert party.turns.cond.wait_for(lambda: 2 in party.turns.waiting, DEADLINE)
    code, details = _status(party_stub.RunStep, _command(1 + STEPS_IN_FLIGHT, train[:4]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "out of order" in details
    assert not early.done() and party.local.version == 0
    first, _ = _full_step(party_stub, stub, 1, train[:4])
    assert first.header.step == 1 and first.metrics["count"] == 4
    senders = [
        threading.Thread(
            target=stub.ExchangeEmbeddings,
            args=(_emb(sender=n, step=2, ids=train[4:8]),),
            kwargs={"timeout": DEADLINE},
        )
        for n in ("passive-1", "passive-2")
    ]
    for t in senders:
        t.start()
    second = early.result(timeout=DEADLINE)
    for t in senders:
        t.join(DEADLINE)
    assert second.header.step == 2 and second.metrics["count"] == 4
    assert party.local.version == 2 and party.last_step == 2


def test_a_refused_run_step_has_no_effect(active):
    """Security finding 3: an unknown sender got UNKNOWN (a KeyError) after resetting the idle timer; a
    far-future step was accepted and parked the party."""
    party, stub, party_stub, train = active
    before = party.liveness._last
    forged = _command(1, train[:4])
    forged.header.sender = "mallory"
    code, details = _status(party_stub.RunStep, forged)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "unknown party 'mallory'" in details
    forged.header.sender = "passive-2"
    code, details = _status(party_stub.RunStep, forged)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "role 'passive'" in details
    assert party.liveness._last == before  # a refused message is no sign of life from the coordinator
    code, details = _status(party_stub.RunStep, _command(50, train[:4]))
    assert (
        code == grpc.StatusCode.FAILED_PRECONDITION and "out of order" in details and "1 is next" in details
    )
    assert party.side.mailbox.slots == {} and party.local.version == 0
    report, _ = _full_step(party_stub, stub, 1, train[:4])
    assert report.metrics["count"] == 4 and party.local.version == 1


@pytest.mark.parametrize("active", ["plain", "traced"], indirect=True)
def test_undecodable_bytes_get_invalid_argument_and_the_server_keeps_serving(active, caplog, monkeypatch):
    """Security finding 8: each undecodable message logged a full traceback and got INTERNAL. With a
    trace on, the tap expected a message and the call failed with UNKNOWN: no mod sees such bytes."""
    from vflnet.wire import errors

    # the throttle counts per process: other tests in this pytest worker may have counted already
    monkeypatch.setattr(errors, "_throttle", errors._Throttle())
    party, stub, party_stub, train = active
    raw = party.test_channel.unary_unary(
        "/vflnet.v1.Party/RunStep", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    for _ in range(20):
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xff", timeout=DEADLINE)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid message" in info.value.details()
    refusals = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert 1 <= len(refusals) <= 6 and not any(r.exc_info for r in refusals)  # 1, 2, 4, 8, 16: throttled
    trace = party.interception.trace
    assert trace is None or trace.records == 0
    report, _ = _full_step(party_stub, stub, 1, train[:4])
    assert report.metrics["count"] == 4
    assert trace is None or trace.records == 6  # the good step's RunStep and two exchanges, both ways


def test_an_oversized_name_is_cut_in_the_status(active):
    """Security finding 8: a 10 kB name echoed into the status turned PERMISSION_DENIED into
    RESOURCE_EXHAUSTED."""
    _, stub, _, _ = active
    code, details = _status(stub.ExchangeEmbeddings, _emb(sender="m" * 10_000))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "(10000 characters)" in details
    assert len(details) < 500
    code, details = _status(stub.ExchangeEmbeddings, _emb(run_id="r" * 10_000))
    assert code == grpc.StatusCode.PERMISSION_DENIED and len(details) < 500


def test_health_answers_per_served_service(active):
    """Security finding 8: per-service health answered NOT_FOUND for the services a role serves."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    party, _, _, _ = active
    health = health_pb2_grpc.HealthStub(party.test_channel)
    for service in ("vflnet.v1.Party", "vflnet.v1.Active"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as info:  # the active party serves no Coordinator
        health.Check(health_pb2.HealthCheckRequest(service="vflnet.v1.Coordinator"), timeout=DEADLINE)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_embeddings_for_a_future_step_park_nothing(active):
    """Security finding 4: ExchangeEmbeddings for future steps each parked a slot (and a worker) forever."""
    party, stub, party_stub, train = active
    for step in (2, 3, 40):
        code, details = _status(stub.ExchangeEmbeddings, _emb(step=step, ids=train[:4]))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "step 1 is next" in details
    assert party.side.mailbox.slots == {}
    report, _ = _full_step(party_stub, stub, 1, train[:4])
    assert report.metrics["count"] == 4
