"""Fuzzing every RPC of every role (docs/security.md): hostile bytes and hostile messages get a
documented status, change nothing, and the servers keep serving with bounded memory.

A split-he cluster (coordinator with a 512-bit test key, the active party, two passive parties) runs
in this process, each role behind its own real gRPC server on loopback, as the role processes build
them. The fuzzer calls each method with raw bytes and with valid messages broken in one or more ways
(wrong run id, unknown or wrong-role sender, oversized names, stale, replayed and future steps, wrong
dtypes and shapes, huge declared dimensions, NaN/Inf, truncated or foreign ciphertexts). Hypothesis
draws the cases from a fixed seed, a bounded number per method. Afterwards the cluster trains a real
step, so a fuzzed server is shown to still work, not just to answer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import base_config
from vflnet.crypto import generate_keypair
from vflnet.crypto.wire import cipher_to_proto
from vflnet.data.alignment import intersect, split_train_test
from vflnet.interceptors.bridge import GrpcBridge
from vflnet.roles.coordinator import CoordinatorHost
from vflnet.roles.party import PartyHost
from vflnet.v1 import messages_pb2, tensor_pb2
from vflnet.validation import config_from_dict
from vflnet.wire import tensors
from vflnet.wire.chunking import CALL_METHOD, FETCH_METHOD, METHOD_KEY

RUN = "fuzz"
DEADLINE = 30
EXAMPLES = 40  # per method and kind of input; derandomized, so every CI run tries the same cases
# What a refused message may get. Never OK, UNKNOWN or INTERNAL (an exception escaped), never a
# deadline (something waited on a message that cannot come).
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
}
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def split_he_config() -> dict[str, Any]:
    data = base_config(n_passive=2, aggregation="sum")
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    data["parties"][2]["bottom"] = data["parties"][3]["bottom"] = {"kind": "mlp", "hidden": [8], "out": 10}
    return data


class Cluster:
    """The four roles of a run (split-he unless ``data`` says otherwise), admitted and ready for step
    1, each behind its own gRPC server."""

    def __init__(self, tmp: Any, data: dict[str, Any] | None = None) -> None:
        data = split_he_config() if data is None else data
        data["run"]["id"] = RUN
        data.setdefault("transport", {}).update(rpc_timeout_s=5)  # a valid call waiting for peers ends in 5 s
        self.cfg = cfg = config_from_dict(data)
        bridge = GrpcBridge(cfg.transport)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "generating an INSECURE", UserWarning)  # test keys, on purpose
            self.coordinator = CoordinatorHost(cfg, tmp, bridge)
        self.parties = {
            p.name: PartyHost(cfg, p.name, tmp, bridge) for p in cfg.parties if p.role != "coordinator"
        }
        self.servers, self.address = [], {}
        for name, host in [("coordinator", self.coordinator), *self.parties.items()]:
            server = bridge.make_server(name, host.interception.chain)
            host.add_services(server)
            self.address[name] = bridge.bind(server, name, "127.0.0.1:0")
            server.start()
            self.servers.append(server)
        self.served = {
            name: sorted(server.served_services)
            for name, server in zip(self.address, self.servers, strict=True)
        }
        common = intersect([h.data.ids for h in self.parties.values()])
        self.train, test = split_train_test(common, cfg.data.test_fraction, cfg.run.seed)
        roster = [
            messages_pb2.PartyInfo(name=n, role=h.role, address=self.address[n])
            for n, h in self.parties.items()
        ]
        reply = messages_pb2.JoinReply(run_id=RUN, roster=roster, train_ids=self.train, test_ids=test)
        self.coordinator.side.join_reply(reply)
        for host in self.parties.values():
            host.coordinator_channel = host.channel(self.address["coordinator"], "coordinator")
            host.prepare(reply)
        self.public_key = getattr(self.coordinator.side, "public_key", None)
        self.channels = {n: grpc.insecure_channel(a) for n, a in self.address.items()}
        self.sent: dict[str, list[bytes]] = {}  # hostile messages sent, by method (replayed in the flood)

    def nothing_moved(self) -> None:
        """What every protocol's refused message could have touched has not moved."""
        assert self.coordinator.admission.joined == {}
        for host in self.parties.values():
            assert host.last_step == 0 and host.local.version == 0, host.name
            assert not host.liveness.shutdown.is_set(), host.name
            assert "released_model" not in host.interception.knowledge, host.name

    def unchanged(self) -> None:
        """Nothing a refused message could have touched has moved (split-he: no decryption spent, no
        step slot parked either)."""
        self.nothing_moved()
        assert self.coordinator.side.served == set() and self.coordinator.side.requests == {}
        assert self.parties["active"].side.mailbox.slots == {}

    def step(self, step: int) -> dict[str, messages_pb2.StepReport]:
        """One real training step, driven as the coordinator's schedule drives it."""
        from vflnet.v1 import services_pb2_grpc

        cmd = messages_pb2.StepCommand(
            header=messages_pb2.Header(run_id=RUN, step=step, sender="coordinator", phase=messages_pb2.TRAIN),
            sample_ids=self.train[(step - 1) * 8 : step * 8],
        )
        calls = {}
        for name in self.parties:
            calls[name] = services_pb2_grpc.PartyStub(self.channels[name]).RunStep.future(
                self.coordinator.side.command(name, cmd), timeout=DEADLINE
            )
        return {name: call.result() for name, call in calls.items()}

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        for host in self.parties.values():
            host.side.stop("fuzz done")
        for server in self.servers:
            server.stop(0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("fuzz"))
    rss = _rss_mb()
    yield c
    # after every fuzz test of this module: memory stayed bounded and the cluster still trains
    assert _rss_mb() - rss < 300, f"RSS grew from {rss:.0f} to {_rss_mb():.0f} MB"
    c.close()


def _refused(cluster: Cluster, target: str, method: str, payload: bytes) -> grpc.StatusCode:
    call = cluster.channels[target].unary_unary(method, request_serializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        call(payload, timeout=DEADLINE)
    code = info.value.code()
    assert code in REFUSALS, (method, code, info.value.details())
    assert len(info.value.details()) < 2000  # nothing caller-supplied is echoed unbounded
    cluster.unchanged()
    return code


# ------------------------------------------------------------------------------ hostile messages
NAMES = st.sampled_from(
    ["", "mallory", "m" * 5000, "coordinator", "active", "passive-1", "passive-2", "\x00\xff"]
)
BAD_STEPS = st.sampled_from([0, -1, 2, 3, 10**9, 2**62])
FOREIGN_KEY: Any = None  # another run's key, made on first use


def _foreign_key() -> Any:
    global FOREIGN_KEY
    if FOREIGN_KEY is None:
        with pytest.warns(UserWarning, match="INSECURE"):
            FOREIGN_KEY = generate_keypair(512, allow_insecure=True)[0]
    return FOREIGN_KEY


def _tensor_breakage(draw: Callable[[Any], Any], good: tensor_pb2.Tensor) -> tensor_pb2.Tensor:
    t = tensor_pb2.Tensor()
    t.CopyFrom(good)
    how = draw(st.sampled_from(["dtype", "shape", "huge", "negative", "truncated", "nan", "inf"]))
    if how == "dtype":
        t.dtype = draw(st.sampled_from(["float16", "object", "complex128", "", "int64", "float64"]))
    elif how == "shape":
        t.shape[:] = draw(st.lists(st.integers(0, 50), max_size=4))
    elif how == "huge":
        t.shape[:] = [2**40, 2**40]
    elif how == "negative":
        t.shape[:] = [-3, 16]
    elif how == "truncated":
        t.data = t.data[: draw(st.integers(0, max(0, len(t.data) - 1)))]
    else:
        values = np.frombuffer(t.data, dtype=np.float32).copy()
        values[draw(st.integers(0, len(values) - 1))] = np.nan if how == "nan" else np.inf
        t.data = values.tobytes()
    return t


def _cipher_breakage(draw: Callable[[Any], Any], good: tensor_pb2.CipherTensor) -> tensor_pb2.CipherTensor:
    c = tensor_pb2.CipherTensor()
    c.CopyFrom(good)
    how = draw(
        st.sampled_from(
            ["key_id", "width", "truncated", "shape", "huge", "slots", "slot_bits", "depth", "foreign"]
        )
    )
    if how == "key_id":
        c.key_id = draw(st.text(max_size=40))
    elif how == "width":
        c.width = draw(st.integers(-5, 10**6).filter(lambda w: w != good.width))
    elif how == "truncated":
        c.data = c.data[: draw(st.integers(0, max(0, len(c.data) - 1)))]
    elif how == "shape":
        c.shape[:] = draw(st.lists(st.integers(0, 50), max_size=3).filter(lambda s: s != list(good.shape)))
    elif how == "huge":
        c.shape[:] = [2**40, 10]
    elif how == "slots":
        c.slots = draw(st.integers(-3, 10**6).filter(lambda s: s != good.slots))
    elif how == "slot_bits":
        c.slot_bits = draw(st.integers(-3, 10**6).filter(lambda s: s != good.slot_bits))
    elif how == "depth":
        c.depth = draw(st.integers(1, 5))
    else:
        c.CopyFrom(cipher_to_proto(_foreign_key().encrypt(np.zeros(tuple(good.shape)), good.frac_bits)))
    return c


@st.composite
def hostile_header(
    draw: Callable[[Any], Any], sender: str, step: int = 1, must_break: bool = True
) -> messages_pb2.Header:
    """A header from ``sender`` for ``step``, broken in at least one way when ``must_break``."""
    h = messages_pb2.Header(run_id=RUN, step=step, sender=sender, phase=messages_pb2.TRAIN)
    breaks = draw(st.lists(st.sampled_from(["run", "sender", "step"]), min_size=int(must_break), unique=True))
    if "run" in breaks:
        h.run_id = draw(st.sampled_from(["", "other-run", "r" * 10_000]))
    if "sender" in breaks:
        h.sender = draw(NAMES.filter(lambda n: n != sender))
    if "step" in breaks:
        h.step = draw(BAD_STEPS)
    h.phase = draw(st.sampled_from([messages_pb2.TRAIN, messages_pb2.TRAIN, messages_pb2.EVAL, 99]))
    return h


@st.composite
def hostile_embeddings(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.Embeddings:
    ids = cluster.train[:8]
    key = cluster.public_key
    msg = messages_pb2.Embeddings(sample_ids=ids)
    good_cipher = cipher_to_proto(key.encrypt(np.zeros((8, 10)), 16))
    payload_broken = draw(st.booleans())
    msg.header.CopyFrom(draw(hostile_header("passive-1", must_break=not payload_broken)))
    if payload_broken:
        kind = draw(st.sampled_from(["cipher", "plaintext", "none", "ids"]))
        if kind == "cipher":
            msg.cipher.CopyFrom(_cipher_breakage(draw, good_cipher))
        elif kind == "plaintext":  # split-he takes ciphertexts only
            msg.values.CopyFrom(_tensor_breakage(draw, tensors.to_proto(np.zeros((8, 10), np.float32))))
        elif kind == "ids":
            msg.cipher.CopyFrom(good_cipher)
            msg.sample_ids[:] = draw(
                st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20).filter(lambda i: len(i) != 8)
            )
    else:
        msg.cipher.CopyFrom(good_cipher)
    return msg


@st.composite
def hostile_step(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.StepCommand:
    ids_broken = draw(st.booleans())
    cmd = messages_pb2.StepCommand(header=draw(hostile_header("coordinator", must_break=not ids_broken)))
    cmd.sample_ids[:] = (
        draw(st.lists(st.integers(10**9, 2**63 - 1), max_size=20)) if ids_broken else cluster.train[:8]
    )
    cmd.checkpoint_after = draw(st.booleans())
    return cmd


@st.composite
def hostile_decrypt(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.DecryptRequest:
    # no step is in flight at the coordinator: every request is out of step, whatever else is wrong
    good = cipher_to_proto(cluster.public_key.encrypt(np.zeros((8, 10)), 16))
    return messages_pb2.DecryptRequest(
        header=draw(hostile_header(draw(st.sampled_from(["active", "passive-1"])), must_break=False)),
        purpose=draw(st.sampled_from(["aggregate_logits", "masked_gradient", "", "labels", "x" * 3000])),
        cipher=_cipher_breakage(draw, good) if draw(st.booleans()) else good,
    )


@st.composite
def hostile_join(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.JoinRequest:
    req = messages_pb2.JoinRequest(run_id=RUN, name="passive-1", role="passive", address="127.0.0.1:1")
    req.sample_ids[:] = draw(st.lists(st.integers(0, 2000), max_size=50))
    for part in draw(st.lists(st.sampled_from(["run", "name", "role"]), min_size=1, unique=True)):
        if part == "run":
            req.run_id = draw(st.sampled_from(["", "other", "r" * 10_000]))
        elif part == "name":
            req.name = draw(NAMES.filter(lambda n: n not in ("passive-1", "passive-2", "active")))
        else:
            req.role = draw(st.sampled_from(["", "active", "coordinator", "root", "p" * 5000]))
    return req


@st.composite
def hostile_release(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.ModelRelease:
    # the run grants no release, so none is accepted from anyone
    msg = messages_pb2.ModelRelease(
        header=draw(
            hostile_header(draw(st.sampled_from(["active", "passive-1", "mallory"])), must_break=False)
        ),
        modules=draw(st.lists(st.sampled_from(["bottom", "top", "", "x" * 3000]), max_size=3)),
        spec=draw(st.text(max_size=50)),
    )
    for name in draw(st.lists(st.sampled_from(["w", "bias", ""]), max_size=2)):
        msg.parameters.tensors[name].CopyFrom(
            _tensor_breakage(draw, tensors.to_proto(np.zeros((2, 2), np.float32)))
            if draw(st.booleans())
            else tensors.to_proto(np.zeros((2, 2), np.float32))
        )
    return msg


@st.composite
def hostile_release_command(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.ReleaseCommand:
    modules_broken = draw(st.booleans())
    return messages_pb2.ReleaseCommand(
        header=draw(hostile_header("coordinator", must_break=not modules_broken)),
        recipient=draw(NAMES),
        modules=draw(st.lists(st.sampled_from(["head", "", "x" * 3000]), min_size=1, max_size=3))
        if modules_broken
        else ["bottom"],
    )


@st.composite
def hostile_shutdown(draw: Callable[[Any], Any], cluster: Cluster) -> messages_pb2.ShutdownRequest:
    req = messages_pb2.ShutdownRequest(run_id=RUN, sender="coordinator", save_checkpoint=draw(st.booleans()))
    for part in draw(st.lists(st.sampled_from(["run", "sender"]), min_size=1, unique=True)):
        if part == "run":
            req.run_id = draw(st.sampled_from(["", "other", "r" * 10_000]))
        else:
            req.sender = draw(NAMES.filter(lambda n: n != "coordinator"))
    req.reason = draw(st.text(max_size=100))
    return req


# (target party, method, strategy of hostile messages)
TARGETS: list[tuple[str, str, Callable[[Cluster], st.SearchStrategy]]] = [
    ("coordinator", "/vflnet.v1.Coordinator/Join", hostile_join),
    ("coordinator", "/vflnet.v1.Coordinator/Decrypt", hostile_decrypt),
    ("coordinator", "/vflnet.v1.Coordinator/ReceiveModel", hostile_release),
    ("active", "/vflnet.v1.Active/ExchangeEmbeddings", hostile_embeddings),
    ("active", "/vflnet.v1.Party/RunStep", hostile_step),
    ("passive-1", "/vflnet.v1.Party/RunStep", hostile_step),
    ("active", "/vflnet.v1.Party/Shutdown", hostile_shutdown),
    ("passive-2", "/vflnet.v1.Party/Shutdown", hostile_shutdown),
    ("passive-1", "/vflnet.v1.Party/ReleaseModel", hostile_release_command),
    ("active", "/vflnet.v1.Party/ReleaseModel", hostile_release_command),
    ("active", "/vflnet.v1.Party/ReceiveModel", hostile_release),
    ("passive-2", "/vflnet.v1.Party/ReceiveModel", hostile_release),
]
IDS = [f"{t}:{m.rsplit('/', 1)[1]}" for t, m, _ in TARGETS]


@pytest.mark.parametrize("target, method, strategy", TARGETS, ids=IDS)
def test_hostile_messages_are_refused_and_change_nothing(cluster, target, method, strategy):
    @FUZZ
    @given(msg=strategy(cluster))
    def fuzz(msg: Any) -> None:
        payload = msg.SerializeToString()
        cluster.sent.setdefault(method, []).append(payload)
        _refused(cluster, target, method, payload)

    fuzz()


@pytest.mark.parametrize("target, method", [(t, m) for t, m, _ in TARGETS], ids=IDS)
def test_random_bytes_are_refused_and_change_nothing(cluster, target, method):
    @FUZZ
    @given(data=st.binary(max_size=3000))
    def fuzz(data: bytes) -> None:
        _refused(cluster, target, method, data)

    fuzz()


@pytest.mark.parametrize("target", ["coordinator", "active", "passive-1"])
def test_hostile_chunk_streams_and_tickets_are_refused(cluster, target):
    methods = [m for t, m, _ in TARGETS if t == target] + ["/vflnet.v1.Nope/Nope", ""]

    @FUZZ
    @given(
        method=st.sampled_from(methods),
        chunks=st.lists(
            st.builds(
                messages_pb2.Chunk,
                data=st.binary(max_size=2000),
                index=st.integers(0, 5),
                count=st.integers(0, 2**32 - 1),
            ),
            max_size=6,
        ),
        ticket=st.text(max_size=64),
    )
    def fuzz(method: str, chunks: list[messages_pb2.Chunk], ticket: str) -> None:
        channel = cluster.channels[target]
        call = channel.stream_stream(CALL_METHOD, messages_pb2.Chunk.SerializeToString, lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter(chunks), metadata=((METHOD_KEY, method),), timeout=DEADLINE))
        assert info.value.code() in REFUSALS, (method, info.value.code(), info.value.details())
        fetch = channel.unary_stream(FETCH_METHOD, messages_pb2.ReplyTicket.SerializeToString, lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            list(fetch(messages_pb2.ReplyTicket(token=ticket), timeout=DEADLINE))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        cluster.unchanged()

    fuzz()


@pytest.mark.parametrize("target", ["coordinator", "active", "passive-1"])
def test_undecodable_bytes_to_the_chunks_service_are_invalid_argument(cluster, target):
    """Raw bytes as the frames of a Chunks/Call stream and as a FetchReply ticket: a refusal (mostly
    INVALID_ARGUMENT), never the INTERNAL of a deserializer that raised."""
    methods = [m for t, m, _ in TARGETS if t == target]
    codes: set[grpc.StatusCode] = set()

    @FUZZ
    @given(
        method=st.sampled_from(methods),
        frames=st.lists(st.binary(max_size=2000), min_size=1, max_size=6),
        ticket=st.binary(max_size=200),
    )
    def fuzz(method: str, frames: list[bytes], ticket: bytes) -> None:
        channel = cluster.channels[target]
        call = channel.stream_stream(CALL_METHOD, lambda b: b, lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter(frames), metadata=((METHOD_KEY, method),), timeout=DEADLINE))
        assert info.value.code() in REFUSALS, (method, info.value.code(), info.value.details())
        codes.add(info.value.code())
        fetch = channel.unary_stream(FETCH_METHOD, lambda b: b, lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            list(fetch(ticket, timeout=DEADLINE))
        assert info.value.code() in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
        codes.add(info.value.code())
        cluster.unchanged()

    fuzz()
    # not a chunk (a wire type protobuf rejects) and not a ticket (a token that is not UTF-8)
    call = cluster.channels[target].stream_stream(CALL_METHOD, lambda b: b, lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        list(call(iter([b"\xff\xff"]), metadata=((METHOD_KEY, methods[0]),), timeout=DEADLINE))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    fetch = cluster.channels[target].unary_stream(FETCH_METHOD, lambda b: b, lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        list(fetch(b"\x0a\x02\xff\xfe", timeout=DEADLINE))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert grpc.StatusCode.INVALID_ARGUMENT in codes


SERVED = {
    "coordinator": {"", "vflnet.v1.Coordinator"},
    "active": {"", "vflnet.v1.Party", "vflnet.v1.Active"},
    "passive-1": {"", "vflnet.v1.Party"},
}


def test_health_and_reflection_answer_hostile_names(cluster):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    @FUZZ
    @given(
        service=st.one_of(st.text(max_size=3000), st.sampled_from(sorted(set().union(*SERVED.values())))),
        target=st.sampled_from(sorted(SERVED)),
    )
    def fuzz(service: str, target: str) -> None:
        health = health_pb2_grpc.HealthStub(cluster.channels[target])
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING and service in SERVED[target]
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:  # reflection is off
            list(
                cluster.channels[target].stream_stream(
                    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", lambda b: b, lambda b: b
                )(iter([service.encode()]), timeout=DEADLINE)
            )
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

    fuzz()


def test_a_flood_of_concurrent_hostile_calls_leaves_the_cluster_training(cluster):
    """Last in this module: many hostile calls at once (a thread pool), then two real training steps."""
    rng = np.random.default_rng(0)
    cases = [(t, m, payload) for t, m, _ in TARGETS for payload in cluster.sent.get(m, [])[:10]]
    cases += [(t, m, rng.bytes(int(rng.integers(0, 3000)))) for t, m, _ in TARGETS for _ in range(10)]
    with futures.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda c: _refused(cluster, *c), cases * 2))
    assert set(codes) <= REFUSALS
    for step in (1, 2):
        reports = cluster.step(step)
        assert reports["active"].metrics["count"] == 8
    assert cluster.parties["active"].local.version == 2
    assert all(h.last_step == 2 for h in cluster.parties.values())


def _params(cluster: Cluster) -> dict[str, np.ndarray]:
    return {
        f"{name}/{module}/{k}": v.detach().numpy().copy()
        for name, host in cluster.parties.items()
        for module, m in host.local.modules.items()
        for k, v in m.state_dict().items()
    }


def _garbage(rng: np.random.Generator) -> list[tuple[str, str, bytes]]:
    """Hostile calls that are wrong whenever they come: random bytes, and well-formed messages of
    another run or from a party outside the roster."""
    h = messages_pb2.Header(run_id="other-run", step=1, sender="passive-1", phase=messages_pb2.TRAIN)
    forged = messages_pb2.Header(run_id=RUN, step=1, sender="mallory", phase=messages_pb2.TRAIN)
    wrong_run = {
        "/vflnet.v1.Active/ExchangeEmbeddings": messages_pb2.Embeddings(header=h, sample_ids=[1, 2]),
        "/vflnet.v1.Party/RunStep": messages_pb2.StepCommand(header=forged, sample_ids=[1, 2]),
        "/vflnet.v1.Party/Shutdown": messages_pb2.ShutdownRequest(run_id="other-run", sender="coordinator"),
        "/vflnet.v1.Coordinator/Decrypt": messages_pb2.DecryptRequest(
            header=forged, purpose="aggregate_logits"
        ),
        "/vflnet.v1.Coordinator/Join": messages_pb2.JoinRequest(
            run_id="other-run", name="active", role="active"
        ),
    }
    calls = [(t, m, rng.bytes(int(rng.integers(1, 2000)))) for t, m, _ in TARGETS]
    calls += [(t, m, wrong_run[m].SerializeToString()) for t, m, _ in TARGETS if m in wrong_run]
    return calls


def _hammer(cluster: Cluster, seed: int, stop: Any, outcome: dict[str, list]) -> None:
    """Send _garbage until ``stop``; every call must be refused (``outcome``: refused, errors)."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        for target, method, payload in _garbage(rng):
            try:
                cluster.channels[target].unary_unary(method, request_serializer=lambda b: b)(
                    payload, timeout=DEADLINE
                )
                outcome["errors"].append((method, "accepted"))
            except grpc.RpcError as exc:
                if exc.code() not in REFUSALS:
                    outcome["errors"].append((method, exc.code(), exc.details()))
                outcome["refused"].append(method)


def test_a_run_fuzzed_while_training_ends_bit_identical_to_one_that_was_not(tmp_path):
    """Hostile calls from four threads all through three training steps change no parameter."""
    import threading

    results = []
    for fuzzed in (False, True):
        (tmp_path / str(fuzzed)).mkdir()
        cluster = Cluster(tmp_path / str(fuzzed))
        stop, outcome = threading.Event(), {"refused": [], "errors": []}
        threads = [
            threading.Thread(target=_hammer, args=(cluster, seed, stop, outcome))
            for seed in range(4 if fuzzed else 0)
        ]
        try:
            start = _params(cluster)
            for t in threads:
                t.start()
            for step in (1, 2, 3):
                cluster.step(step)
        finally:
            stop.set()
            for t in threads:
                t.join(DEADLINE)
            cluster.close()
        assert outcome["errors"] == []
        assert len(outcome["refused"]) >= (20 if fuzzed else 0)
        results.append((start, _params(cluster)))
    (start_plain, end_plain), (start_fuzzed, end_fuzzed) = results
    assert all(np.array_equal(start_plain[k], start_fuzzed[k]) for k in start_plain)  # same seeded start
    assert any(not np.array_equal(start_plain[k], end_plain[k]) for k in start_plain)  # it trained
    assert all(np.array_equal(end_plain[k], end_fuzzed[k]) for k in end_plain), "fuzzing changed training"


# ------------------------------------------------------------- every RPC of every protocol
@st.composite
def random_message(draw: Callable[[Any], Any], cls: type[Any], depth: int = 0) -> Any:
    """A message of ``cls`` with random values in random fields (from its descriptor): names of the
    run's parties and its run id among them, so that checks past the first one get exercised too."""
    from google.protobuf.descriptor import FieldDescriptor as F

    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        if field.type == F.TYPE_MESSAGE:
            if depth >= 2 or field.message_type.GetOptions().map_entry:
                continue
            holder = getattr(cls(), field.name)
            sub_cls = type(holder.add()) if field.is_repeated else type(holder)
            values = [draw(random_message(sub_cls, depth + 1)) for _ in range(draw(st.integers(1, 2)))]
            if field.is_repeated:
                getattr(msg, field.name).extend(values)
            else:
                getattr(msg, field.name).CopyFrom(values[0])
            continue
        if field.type in (F.TYPE_STRING,):
            value = st.one_of(
                st.sampled_from([RUN, "coordinator", "active", "passive-1", "train"]), st.text(max_size=30)
            )
        elif field.type == F.TYPE_BYTES:
            value = st.binary(max_size=300)
        elif field.type == F.TYPE_BOOL:
            value = st.booleans()
        elif field.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            value = st.floats(width=32 if field.type == F.TYPE_FLOAT else 64)
        elif field.type == F.TYPE_ENUM:
            value = st.sampled_from([v.number for v in field.enum_type.values])
        elif field.type in (F.TYPE_UINT32, F.TYPE_FIXED32):
            value = st.integers(0, 2**32 - 1)
        elif field.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
            value = st.integers(0, 2**64 - 1)
        elif field.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
            value = st.integers(-(2**31), 2**31 - 1)
        else:
            value = st.integers(-(2**63), 2**63 - 1)
        if field.is_repeated:
            getattr(msg, field.name).extend(draw(st.lists(value, max_size=5)))
        else:
            setattr(msg, field.name, draw(value))
    return msg


def _protocol_configs() -> dict[str, Callable[[], dict[str, Any]]]:
    def split() -> dict[str, Any]:
        return base_config(n_passive=2)

    def param_server() -> dict[str, Any]:
        data = base_config(n_passive=2, active_features=True)
        data["protocol"] = {"kind": "param-server", "aggregation": "concat"}
        return data

    def hashvfl() -> dict[str, Any]:
        data = base_config(n_passive=2)
        data["protocol"] = {"kind": "hashvfl", "aggregation": "concat", "params": {"variant": "hashvfl"}}
        for p in data["parties"][2:]:
            p["bottom"]["out"] = 4
        return data

    def secureboost() -> dict[str, Any]:
        from tests.test_secureboost import tree_config

        data = tree_config("he")
        data["protocol"]["params"].update(key_bits=512, allow_insecure_keys=True)
        return data

    return {
        "split": split,
        "split-he": split_he_config,
        "param-server": param_server,
        "hashvfl": hashvfl,
        "secureboost": secureboost,
    }


@pytest.mark.parametrize("protocol", sorted(_protocol_configs()))
def test_every_rpc_of_every_protocol_answers_random_messages_with_a_status(tmp_path, protocol):
    """Each method each role of the protocol serves (its own services included: secureboost's tree
    service, hashvfl's codes) gets random bytes and random messages: a refusal or a reply, never
    UNKNOWN or INTERNAL, nothing moves, and the servers keep serving."""
    from vflnet.interceptors.events import METHODS

    cluster = Cluster(tmp_path, _protocol_configs()[protocol]())
    try:
        targets = [
            (name, method)
            for name, services in cluster.served.items()
            for method in METHODS
            if method.lstrip("/").rsplit("/", 1)[0] in services
        ]
        assert {m for _, m in targets} >= {"/vflnet.v1.Party/RunStep", "/vflnet.v1.Coordinator/Join"}

        @FUZZ
        @given(
            target=st.sampled_from(targets),
            payload=st.one_of(
                st.binary(max_size=2000),
                st.sampled_from(targets)
                .flatmap(lambda t: random_message(METHODS[t[1]][0]))
                .map(lambda m: m.SerializeToString()),
            ),
        )
        def fuzz(target: tuple[str, str], payload: bytes) -> None:
            name, method = target
            call = cluster.channels[name].unary_unary(method, request_serializer=lambda b: b)
            try:
                call(payload, timeout=DEADLINE)
            except grpc.RpcError as exc:
                assert exc.code() in REFUSALS | {grpc.StatusCode.ABORTED}, (method, exc.code(), exc.details())
                assert len(exc.details() or "") < 2000
            cluster.nothing_moved()

        fuzz()
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        for name, channel in cluster.channels.items():  # every server still serves
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=DEADLINE
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
    finally:
        cluster.close()
