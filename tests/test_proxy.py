"""The proxy role on loopback: a transparent gRPC man-in-the-middle on plaintext, powerless under mTLS."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from test_interceptors import (
    DEADLINE,
    EXCHANGE,
    RUN_STEP,
    EchoActive,
    Recorder,
    embeddings,
    scale_values,
    start_server,
    values_of,
)

from vflnet.config import TransportConfig
from vflnet.interceptors import Chain, Refused, TraceWriter, WireEvent, read_trace
from vflnet.interceptors.trace import iter_entries
from vflnet.roles import proxy
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire import tls


@pytest.fixture
def active() -> EchoActive:
    return EchoActive()


@pytest.fixture
def upstream(active: EchoActive) -> Iterator[str]:
    server, address = start_server(active)
    yield address
    server.stop(grace=0)


def start_proxy(upstream: str, chain: Chain, **kwargs: object) -> tuple[grpc.Server, str]:
    server, port = proxy.run_proxy("127.0.0.1:0", upstream, chain, TransportConfig(), **kwargs)  # type: ignore[arg-type]
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def tapped_proxy(upstream: str) -> Iterator[tuple[str, Recorder, grpc.Server]]:
    rec = Recorder()
    server, address = start_proxy(upstream, Chain([rec]))
    yield address, rec, server
    server.stop(grace=0)


def test_proxy_replies_are_identical_to_direct_calls_and_taps_see_both_ways(
    active: EchoActive, upstream: str, tapped_proxy: tuple[str, Recorder, grpc.Server]
) -> None:
    address, rec, server = tapped_proxy
    msg = embeddings(step=5, n=6, dim=2, seed=1)
    command = messages_pb2.StepCommand(header=msg.header, sample_ids=[4, 5, 6])
    with grpc.insecure_channel(upstream) as direct, grpc.insecure_channel(address) as via:
        replies = [
            (
                services_pb2_grpc.ActiveStub(c).ExchangeEmbeddings(msg, timeout=DEADLINE),
                services_pb2_grpc.PartyStub(c).RunStep(command, timeout=DEADLINE),
            )
            for c in (direct, via)
        ]
    assert replies[0] == replies[1]
    assert replies[1][1].metrics["count"] == 3.0
    assert active.received[0].SerializeToString() == active.received[1].SerializeToString()
    assert [(e.method, e.direction) for e in rec.events] == [
        (EXCHANGE, "request"),
        (EXCHANGE, "response"),
        (RUN_STEP, "request"),
        (RUN_STEP, "response"),
    ]
    assert all(e.side == "proxy" and e.party == "proxy" for e in rec.events)
    assert rec.events[0].peer.startswith("ipv4:127.0.0.1:") and rec.events[1].peer == upstream
    assert rec.events[0].message == msg and rec.events[1].step == 5
    assert server.forwarding.forwarded == {EXCHANGE: 1, RUN_STEP: 1}


def test_proxy_rewrites_what_the_upstream_receives_and_the_caller_gets(
    active: EchoActive, upstream: str
) -> None:
    chain = Chain(
        [scale_values(4.0, messages_pb2.Embeddings), scale_values(0.5, messages_pb2.EmbeddingGradients)]
    )
    server, address = start_proxy(upstream, chain)
    msg = embeddings(seed=3)
    try:
        with grpc.insecure_channel(address) as channel:
            reply = services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(msg, timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    np.testing.assert_allclose(values_of(active.received[0]), values_of(msg) * 4, rtol=1e-6)
    np.testing.assert_allclose(values_of(reply), values_of(msg) * 2, rtol=1e-6)


def test_status_codes_details_and_deadlines_cross_the_proxy(
    active: EchoActive, tapped_proxy: tuple[str, Recorder, grpc.Server]
) -> None:
    address, rec, _ = tapped_proxy
    with grpc.insecure_channel(address) as channel:
        stub = services_pb2_grpc.ActiveStub(channel)
        with pytest.raises(grpc.RpcError) as stale:
            stub.ExchangeEmbeddings(embeddings(step=-1), timeout=DEADLINE)
        with pytest.raises(grpc.RpcError) as missing:
            services_pb2_grpc.CoordinatorStub(channel).Join(
                messages_pb2.JoinRequest(run_id="r1"), timeout=DEADLINE
            )
        with pytest.raises(grpc.RpcError) as late:
            stub.ExchangeEmbeddings(embeddings(batch_id=1), timeout=0.5)  # waits for a gate nobody opens
    assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert stale.value.details() == "step -1 is stale"
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED  # the upstream serves no Coordinator
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # without forwarding, the upstream would see no deadline at all (None)
    assert active.deadlines[0] is not None and active.deadlines[0] < DEADLINE + 1
    assert active.deadlines[1] is not None and active.deadlines[1] < 1.0
    assert [e.direction for e in rec.events if e.method == EXCHANGE] == ["request", "request"]


def test_a_proxy_mod_can_refuse(active: EchoActive, upstream: str) -> None:
    def block(event: WireEvent) -> None:
        raise Refused("dropped by the attacker", grpc.StatusCode.UNAVAILABLE)

    server, address = start_proxy(upstream, Chain([block]))
    try:
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
            services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(embeddings(), timeout=DEADLINE)
    finally:
        server.stop(grace=0)
    assert (
        info.value.code() == grpc.StatusCode.UNAVAILABLE and "dropped by the attacker" in info.value.details()
    )
    assert active.received == []


def test_proxy_trace_records_the_conversation(tmp_path: Path, upstream: str) -> None:
    path = tmp_path / "proxy.trace"
    writer = TraceWriter(path, party="mitm", run_id="r1")
    server, address = start_proxy(upstream, Chain([writer]), name="mitm")
    try:
        with grpc.insecure_channel(address) as channel:
            services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(embeddings(step=2), timeout=DEADLINE)
    finally:
        server.stop(grace=0)
        writer.close()
    back = list(read_trace(path))
    assert [(e.party, e.side, e.direction, e.step) for e in back] == [
        ("mitm", "proxy", "request", 2),
        ("mitm", "proxy", "response", 2),
    ]
    np.testing.assert_array_equal(back[1].tensors()["values"], values_of(embeddings(step=2)))


def test_cli_parser_and_tcp_trace_refusal() -> None:
    args = proxy.build_parser().parse_args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"])
    assert (args.mode, args.name, args.trace) == ("grpc", "proxy", None)
    with pytest.raises(SystemExit):
        proxy.main(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--mode", "tcp", "--trace", "x"])


# ---------------------------------------------------------------------------------------- TLS
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    good = tmp_path_factory.mktemp("pki")
    tls.make_ca(good)
    tls.issue_party_cert(good, "active", "active")
    tls.issue_party_cert(good, "passive-1", "passive")
    evil = tmp_path_factory.mktemp("evil-pki")
    tls.make_ca(evil, common_name="the proxy's own CA")
    tls.issue_party_cert(evil, "active", "active")  # same name, untrusted issuer
    return {"good": good, "evil": evil}


def party_creds(ca_dir: Path, name: str) -> tuple[Path, Path, Path]:
    return ca_dir / "ca.pem", ca_dir / f"{name}.pem", ca_dir / f"{name}.key"


@pytest.fixture
def tls_upstream(pki: dict[str, Path], active: EchoActive) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[tls.RoleAuthorizer()])
    services_pb2_grpc.add_ActiveServicer_to_server(active, server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(*party_creds(pki["good"], "active")))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=0)


def passive_tls_channel(pki: dict[str, Path], address: str) -> grpc.Channel:
    return grpc.secure_channel(address, tls.channel_credentials(*party_creds(pki["good"], "passive-1")))


def call_exchange(channel: grpc.Channel) -> messages_pb2.EmbeddingGradients:
    with channel:
        return services_pb2_grpc.ActiveStub(channel).ExchangeEmbeddings(embeddings(seed=7), timeout=DEADLINE)


def test_grpc_proxy_cannot_talk_to_a_tls_upstream(
    pki: dict[str, Path], active: EchoActive, tls_upstream: str
) -> None:
    reply = call_exchange(passive_tls_channel(pki, tls_upstream))  # control: the direct TLS call works
    np.testing.assert_array_equal(values_of(reply), values_of(embeddings(seed=7)))
    rec = Recorder()
    server, address = start_proxy(tls_upstream, Chain([rec]))
    try:
        # a caller that drops TLS to talk to the proxy: the upstream refuses the proxy's plaintext
        with pytest.raises(grpc.RpcError) as plain:
            call_exchange(grpc.insecure_channel(address))
        # a TLS caller: no handshake with a plaintext proxy
        with pytest.raises(grpc.RpcError) as handshake:
            call_exchange(passive_tls_channel(pki, address))
    finally:
        server.stop(grace=0)
    assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    assert handshake.value.code() == grpc.StatusCode.UNAVAILABLE
    assert [e.direction for e in rec.events] == [
        "request"
    ]  # the proxy saw only what a plaintext caller gave it
    assert len(active.received) == 1  # only the control call arrived


def test_tls_terminating_proxy_with_its_own_certificate_is_refused(
    pki: dict[str, Path], active: EchoActive, tls_upstream: str
) -> None:
    rec = Recorder()
    evil = party_creds(pki["evil"], "active")
    server, address = start_proxy(
        tls_upstream,
        Chain([rec]),
        listen_credentials=grpc.ssl_server_credentials([(evil[2].read_bytes(), evil[1].read_bytes())]),
        upstream_credentials=tls.channel_credentials(*evil),
    )
    try:
        with pytest.raises(grpc.RpcError) as info:
            call_exchange(passive_tls_channel(pki, address))  # the passive party trusts only the run's CA
    finally:
        server.stop(grace=0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert rec.events == [] and active.received == []


class TlsRecordFlipper:
    """Byte rewrite for one connection: flips one bit inside the ``n``-th TLS application-data record
    the client sends (record type 23); everything else passes untouched."""

    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.records = 0
        self.pending = 0  # payload bytes left in the current record
        self.head = bytearray()  # partial 5-byte record header

    def __call__(self, chunk: bytes, direction: str) -> bytes:
        if direction != "up":
            return chunk
        out = bytearray(chunk)
        i = 0
        while i < len(out):
            if self.pending:
                take = min(self.pending, len(out) - i)
                if self.records == self.n and self.pending == take:  # last byte of the record: its auth tag
                    out[i + take - 1] ^= 0x01
                self.pending -= take
                i += take
                continue
            need = 5 - len(self.head)
            self.head += out[i : i + need]
            i += min(need, len(out) - i)
            if len(self.head) == 5:
                if self.head[0] == 23:
                    self.records += 1
                self.pending = int.from_bytes(self.head[3:5], "big")
                self.head.clear()
        return bytes(out)


def start_relay(
    upstream: str, rewrite: Callable[[], proxy.ByteMod] | None = None
) -> tuple[proxy.TcpRelay, str]:
    relay = proxy.TcpRelay("127.0.0.1:0", upstream, rewrite=rewrite, max_connections=4)
    return relay, f"127.0.0.1:{relay.start()}"


def test_tcp_relay_reads_plaintext_grpc(active: EchoActive, upstream: str) -> None:
    relay, address = start_relay(upstream)
    try:
        reply = call_exchange(grpc.insecure_channel(address))
    finally:
        relay.stop()
    np.testing.assert_array_equal(values_of(reply), values_of(embeddings(seed=7)))
    assert relay.stats.bytes_up > 0 and relay.stats.bytes_down > 0
    assert relay.stats.messages["Embeddings"] == 1  # on plaintext the relay can read the embeddings
    assert relay.stats.messages_seen == 2


def test_tcp_relay_passes_tls_but_reads_nothing(
    pki: dict[str, Path], active: EchoActive, tls_upstream: str
) -> None:
    relay, address = start_relay(tls_upstream)
    try:
        reply = call_exchange(passive_tls_channel(pki, address))
    finally:
        relay.stop()
    np.testing.assert_array_equal(values_of(reply), values_of(embeddings(seed=7)))
    assert relay.stats.bytes_up > 1000 and relay.stats.bytes_down > 1000
    assert relay.stats.messages_seen == 0


def test_tcp_relay_bit_flip_under_tls_fails_the_call(
    pki: dict[str, Path], active: EchoActive, tls_upstream: str
) -> None:
    flippers: list[TlsRecordFlipper] = []

    def new_flipper() -> TlsRecordFlipper:
        flippers.append(TlsRecordFlipper(n=2))
        return flippers[-1]

    relay, address = start_relay(tls_upstream, rewrite=new_flipper)
    try:
        with pytest.raises(grpc.RpcError) as info:
            call_exchange(passive_tls_channel(pki, address))
    finally:
        relay.stop()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # the receiver saw a bad record MAC
    assert flippers and any(f.records >= 2 for f in flippers)  # a bit really was flipped
    assert active.received == []  # nothing altered (or at all) reached the servicer
    assert relay.stats.messages_seen == 0


def test_tcp_relay_bit_flip_on_plaintext_is_accepted(active: EchoActive, upstream: str) -> None:
    """The contrast to the TLS case: without TLS a flipped bit silently changes what the servicer gets."""
    target = embeddings(seed=7).values.data  # the raw float32 bytes of the embeddings

    def flip_in_tensor(chunk: bytes, direction: str) -> bytes:
        at = chunk.find(target)
        if direction != "up" or at < 0:
            return chunk
        out = bytearray(chunk)
        out[at + 3] ^= 0x40  # an exponent bit of the first float
        return bytes(out)

    relay, address = start_relay(upstream, rewrite=lambda: flip_in_tensor)
    try:
        reply = call_exchange(grpc.insecure_channel(address))
    finally:
        relay.stop()
    sent, got = values_of(embeddings(seed=7)), values_of(active.received[0])
    assert got[0, 0] != sent[0, 0] and np.array_equal(got.reshape(-1)[1:], sent.reshape(-1)[1:])
    np.testing.assert_array_equal(values_of(reply), got)


@pytest.mark.e2e
def test_proxy_command_serves_until_terminated_and_keeps_its_trace(tmp_path: Path, upstream: str) -> None:
    trace = tmp_path / "mitm.trace"
    cmd = [
        sys.executable,
        "-m",
        "vflnet.roles.proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--trace",
        str(trace),
        "--run-id",
        "r9",
        "--name",
        "mitm",
    ]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("proxy mitm (grpc) on port "), line + process.stderr.read()  # type: ignore[union-attr]
        port = int(line.split("on port ")[1].split()[0])
        reply = call_exchange(grpc.insecure_channel(f"127.0.0.1:{port}"))
    finally:
        process.send_signal(signal.SIGTERM)
        assert exit_code_or_stacks(process) == 0
    np.testing.assert_array_equal(values_of(reply), values_of(embeddings(seed=7)))
    back = list(read_trace(trace))
    assert [(e.party, e.direction) for e in back] == [("mitm", "request"), ("mitm", "response")]
    assert next(iter_entries(trace)).header.run_id == "r9"


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["grpc", "tcp"])
def test_proxy_command_stops_cleanly_on_a_signal_sent_as_soon_as_it_serves(mode: str, upstream: str) -> None:
    """The signal handling is in place before the ready line: SIGTERM right after it is a clean stop."""
    cmd = [sys.executable, "-m", "vflnet.roles.proxy", "--mode", mode, "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(
        [*cmd, "--upstream", upstream], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(f"proxy proxy ({mode}) on port "), line
    finally:
        process.send_signal(signal.SIGTERM)
        assert exit_code_or_stacks(process) == 0
    if mode == "tcp":
        assert process.stdout.read().startswith("relayed 0 connections")  # type: ignore[union-attr]


def exit_code_or_stacks(process: subprocess.Popen[str], timeout: float = 60.0) -> int:
    """The process's exit code; if it has not exited in ``timeout`` s, fail with every thread's stack
    (the proxy prints them on SIGUSR1) and its log."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
        _, err = process.communicate()
        pytest.fail(f"the proxy did not exit within {timeout:.0f} s of SIGTERM:\n{err[-6000:]}")
