"""Before the roster is complete the active party has not finished joining. A malformed
ExchangeEmbeddings is refused at once (not held until the caller's deadline); a well-formed one waits,
bounded per sender, and gets a status before its caller's deadline. Real processes, real gRPC."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from conftest import REPO, base_config, write_config
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vflnet.roles.step_order import STEPS_IN_FLIGHT
from vflnet.runner.local import free_port
from vflnet.v1 import messages_pb2, tensor_pb2
from vflnet.wire import tensors

pytestmark = pytest.mark.e2e

RUN = "prejoin"
DIM = 16  # the passive parties' bottom output (base_config, concat)
EXCHANGE = "/vflnet.v1.Active/ExchangeEmbeddings"
START_S = 300  # generous bound for two processes to start on a loaded machine
DEADLINE_S = 60  # each malformed call's deadline: far longer than the answer may take
ANSWERED_S = 20  # "well before the deadline"


@pytest.fixture(scope="module")
def active(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    """A coordinator and its active party, admitted and waiting for passive parties that never come."""
    tmp = tmp_path_factory.mktemp("prejoin")
    data = base_config(n_passive=2)
    data["run"]["id"] = RUN
    data["transport"]["heartbeat_s"] = 0  # nothing but the calls below
    path = write_config(tmp, data)
    run_dir = tmp / "run"
    run_dir.mkdir()

    def start(*args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "vflnet", "party", "--config", str(path), "--run-dir", str(run_dir)]
        log = (tmp / f"{args[1]}.log").open("wb")
        return subprocess.Popen([*cmd, *args], stdout=log, stderr=log, cwd=REPO)

    coordinator, port = free_port(), free_port()
    procs = [start("--role", "coordinator", "--name", "coordinator", "--listen", f"127.0.0.1:{coordinator}")]
    _wait_serving(coordinator)
    procs.append(
        start(
            "--role", "active", "--name", "active", "--listen", f"127.0.0.1:{port}",
            "--coordinator", f"127.0.0.1:{coordinator}",
        )
    )  # fmt: skip
    _wait_serving(port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        channel.close()
        for p in procs:
            p.kill()
            p.wait()


def _wait_serving(port: int) -> None:
    """Readiness: the server on ``port`` answers a health check."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=START_S, wait_for_ready=True
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _embeddings(sender: str = "passive-1", rows: int = 4, **change: object) -> messages_pb2.Embeddings:
    values = change.pop("values", np.zeros((rows, DIM), dtype=np.float32))
    msg = messages_pb2.Embeddings(
        header=messages_pb2.Header(run_id=str(change.pop("run_id", RUN)), sender=sender, step=1),
        sample_ids=list(range(rows)),
    )
    if "cipher" in change:
        msg.cipher.CopyFrom(change.pop("cipher"))
    else:
        msg.values.CopyFrom(tensors.to_proto(values))
    return msg


MALFORMED = {
    "float64": (_embeddings(values=np.zeros((4, DIM))), grpc.StatusCode.INVALID_ARGUMENT),
    "nan": (_embeddings(values=np.full((4, DIM), np.nan, np.float32)), grpc.StatusCode.INVALID_ARGUMENT),
    "inf": (_embeddings(values=np.full((4, DIM), np.inf, np.float32)), grpc.StatusCode.INVALID_ARGUMENT),
    "wrong-width": (_embeddings(values=np.zeros((4, DIM + 1), np.float32)), grpc.StatusCode.INVALID_ARGUMENT),
    "wrong-rows": (_embeddings(values=np.zeros((5, DIM), np.float32)), grpc.StatusCode.INVALID_ARGUMENT),
    "ciphertext": (
        _embeddings(cipher=tensor_pb2.CipherTensor(shape=[4, DIM])),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "unknown-sender": (_embeddings("mallory"), grpc.StatusCode.PERMISSION_DENIED),
    "wrong-role-sender": (_embeddings("active"), grpc.StatusCode.PERMISSION_DENIED),
    "other-run": (_embeddings(run_id="another"), grpc.StatusCode.PERMISSION_DENIED),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_message_before_the_roster_is_complete_is_refused_at_once(active, kind):
    msg, code = MALFORMED[kind]
    call = active.unary_unary(EXCHANGE, messages_pb2.Embeddings.SerializeToString, lambda b: b)
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call(msg, timeout=DEADLINE_S)
    took = time.monotonic() - start
    assert info.value.code() == code, info.value.details()
    assert took < ANSWERED_S, f"answered after {took:.1f} s of a {DEADLINE_S} s deadline"


def test_well_formed_messages_wait_bounded_per_sender_and_get_a_status_before_their_deadline(active):
    """STEPS_IN_FLIGHT (one per step in flight) from passive-1 may wait; one more is refused at once,
    whichever arrives last; those waiting get UNAVAILABLE before their deadline, never
    DEADLINE_EXCEEDED."""
    call = active.unary_unary(EXCHANGE, messages_pb2.Embeddings.SerializeToString, lambda b: b)
    deadline_s = 20
    start = time.monotonic()
    futures = [call.future(_embeddings(), timeout=deadline_s) for _ in range(STEPS_IN_FLIGHT + 1)]
    codes = []
    for f in futures:
        with pytest.raises(grpc.RpcError) as info:
            f.result()
        codes.append(info.value.code())
    took = time.monotonic() - start
    assert sorted(codes, key=str) == sorted(
        [grpc.StatusCode.RESOURCE_EXHAUSTED] + [grpc.StatusCode.UNAVAILABLE] * STEPS_IN_FLIGHT, key=str
    ), codes
    assert took < deadline_s
    # another sender has its own place
    with pytest.raises(grpc.RpcError) as info:
        call(_embeddings("passive-2"), timeout=4)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
