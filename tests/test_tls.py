"""Mutual TLS and role authorization on real gRPC servers bound to 127.0.0.1 (ephemeral ports)."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.conftest import tls_in
from vflnet.config import TransportConfig
from vflnet.wire import certs_cli, healthcheck, tls
from vflnet.wire.channels import bind, make_server

DEADLINE = 5.0
STREAM_METHOD = "/test.Echo/Stream"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run's CA with a coordinator, an active and a passive party, plus a foreign CA."""
    good = tmp_path_factory.mktemp("pki")
    tls.make_ca(good)
    tls.issue_party_cert(good, "coord", "coordinator")
    tls.issue_party_cert(good, "alice", "active")
    tls.issue_party_cert(good, "bob", "passive")
    other = tmp_path_factory.mktemp("other-pki")
    tls.make_ca(other, common_name="someone else's CA")
    tls.issue_party_cert(other, "coord", "coordinator")  # same name and role, wrong issuer
    return {"good": good, "other": other}


def creds(ca_dir: Path, name: str, cert_dir: Path | None = None) -> grpc.ChannelCredentials:
    cert_dir = ca_dir if cert_dir is None else cert_dir
    return tls.channel_credentials(ca_dir / "ca.pem", cert_dir / f"{name}.pem", cert_dir / f"{name}.key")


class Recorder:
    """Generic handlers standing in for vflnet servicers: reply with the caller's certificate identity."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def whoami(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        peer = tls.peer_identity(context)
        self.calls.append(context.peer())
        return b"anonymous" if peer is None else f"{peer.name}/{peer.role}".encode()

    def stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self.calls.append(context.peer())
        yield request
        yield request

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        unary = grpc.unary_unary_rpc_method_handler(self.whoami)
        return [
            grpc.method_handlers_generic_handler(
                "vflnet.v1.Coordinator", {"Join": unary, "Decrypt": unary, "Unlisted": unary}
            ),
            grpc.method_handlers_generic_handler("vflnet.v1.Party", {"RunStep": unary}),
            grpc.method_handlers_generic_handler(
                "test.Echo", {"Stream": grpc.unary_stream_rpc_method_handler(self.stream)}
            ),
        ]


def start_server(recorder: Recorder, credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, str]:
    default = tls.RoleAuthorizer()  # vflnet's permissions, the built-in protocols' (Decrypt's) included
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        handlers=recorder.handlers(),
        interceptors=[tls.RoleAuthorizer({**default.allowed, STREAM_METHOD: {"passive"}})],
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def tls_server(pki: dict[str, Path]) -> Iterator[tuple[Recorder, str]]:
    good = pki["good"]
    recorder = Recorder()
    server, address = start_server(
        recorder, tls.server_credentials(good / "ca.pem", good / "coord.pem", good / "coord.key")
    )
    yield recorder, address
    server.stop(grace=None)


def call(address: str, credentials: grpc.ChannelCredentials | None, method: str, **kwargs: object) -> bytes:
    channel = (
        grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    )
    with channel:
        return channel.unary_unary(method)(b"ping", timeout=DEADLINE, **kwargs)


def rpc_error(
    address: str, credentials: grpc.ChannelCredentials | None, method: str, **kwargs: object
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(address, credentials, method, **kwargs)
    return info.value


def test_mutual_tls_identity_comes_from_certificate(tls_server, pki) -> None:
    recorder, address = tls_server
    assert call(address, creds(pki["good"], "alice"), "/vflnet.v1.Coordinator/Join") == b"alice/active"
    # Metadata claiming another identity changes nothing: only the certificate counts.
    spoof = (("x-vflnet-name", "coord"), ("x-vflnet-role", "coordinator"))
    assert (
        call(address, creds(pki["good"], "bob"), "/vflnet.v1.Coordinator/Decrypt", metadata=spoof)
        == b"bob/passive"
    )
    assert call(address, creds(pki["good"], "coord"), "/vflnet.v1.Party/RunStep") == b"coord/coordinator"
    # PEM bytes work as well as paths.
    pem = [(pki["good"] / f).read_bytes() for f in ("ca.pem", "alice.pem", "alice.key")]
    assert call(address, tls.channel_credentials(*pem), "/vflnet.v1.Coordinator/Join") == b"alice/active"
    assert len(recorder.calls) == 4


def test_wrong_role_is_denied_and_server_keeps_serving(tls_server, pki) -> None:
    recorder, address = tls_server
    err = rpc_error(address, creds(pki["good"], "bob"), "/vflnet.v1.Party/RunStep")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'bob'" in err.details() and "role passive" in err.details()
    assert "/vflnet.v1.Party/RunStep" in err.details() and "coordinator" in err.details()
    assert recorder.calls == []  # the servicer never ran
    assert call(address, creds(pki["good"], "coord"), "/vflnet.v1.Party/RunStep") == b"coord/coordinator"
    assert call(address, creds(pki["good"], "bob"), "/vflnet.v1.Coordinator/Join") == b"bob/passive"


def test_a_vflnet_server_checks_the_role_on_every_call_of_a_method_it_has_served(pki) -> None:
    """The chunking layer builds a method's handler once and keeps it: the role check inside must
    still run for each call, whoever called the method before."""
    good = pki["good"]
    transport = TransportConfig(tls=tls_in(good))
    recorder = Recorder()
    server = make_server(transport, "coord")
    server.add_generic_rpc_handlers(recorder.handlers())
    address = f"127.0.0.1:{bind(server, '127.0.0.1:0', transport, 'coord')}"
    server.start()
    try:
        for _ in range(2):
            assert call(address, creds(good, "coord"), "/vflnet.v1.Party/RunStep") == b"coord/coordinator"
            err = rpc_error(address, creds(good, "bob"), "/vflnet.v1.Party/RunStep")
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "'bob'" in err.details()
        assert len(recorder.calls) == 2  # the servicer ran for the coordinator's calls only
    finally:
        server.stop(grace=None)


def test_method_without_permission_entry_is_denied(tls_server, pki) -> None:
    recorder, address = tls_server
    err = rpc_error(address, creds(pki["good"], "coord"), "/vflnet.v1.Coordinator/Unlisted")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "no permission entry" in err.details()
    assert recorder.calls == []


def test_streaming_methods_are_guarded_too(tls_server, pki) -> None:
    recorder, address = tls_server
    with grpc.secure_channel(address, creds(pki["good"], "bob")) as channel:
        assert list(channel.unary_stream(STREAM_METHOD)(b"x", timeout=DEADLINE)) == [b"x", b"x"]
    with grpc.secure_channel(address, creds(pki["good"], "alice")) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(channel.unary_stream(STREAM_METHOD)(b"x", timeout=DEADLINE))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'alice'" in info.value.details()
    assert len(recorder.calls) == 1


def test_client_without_certificate_is_refused(tls_server, pki) -> None:
    recorder, address = tls_server
    no_cert = grpc.ssl_channel_credentials(root_certificates=(pki["good"] / "ca.pem").read_bytes())
    err = rpc_error(address, no_cert, "/vflnet.v1.Coordinator/Join")
    # The server aborts the handshake; the client only learns that the connection was closed.
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "failed to connect" in err.details() and address in err.details()
    assert recorder.calls == []
    assert call(address, creds(pki["good"], "alice"), "/vflnet.v1.Coordinator/Join") == b"alice/active"


def test_client_certificate_from_another_ca_is_refused(tls_server, pki) -> None:
    recorder, address = tls_server
    impostor = creds(pki["good"], "coord", cert_dir=pki["other"])  # trusts our CA, presents a foreign cert
    err = rpc_error(address, impostor, "/vflnet.v1.Party/RunStep")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "failed to connect" in err.details()
    assert recorder.calls == []
    assert call(address, creds(pki["good"], "coord"), "/vflnet.v1.Party/RunStep") == b"coord/coordinator"


def test_client_refuses_server_from_another_ca(pki) -> None:
    other = pki["other"]
    server, address = start_server(
        Recorder(), tls.server_credentials(other / "ca.pem", other / "coord.pem", other / "coord.key")
    )
    try:
        err = rpc_error(address, creds(pki["good"], "alice"), "/vflnet.v1.Coordinator/Join")
    finally:
        server.stop(grace=None)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "CERTIFICATE_VERIFY_FAILED" in err.details()


def test_client_refuses_server_certificate_for_another_host(tls_server, pki) -> None:
    _, address = tls_server
    with grpc.secure_channel(
        address, creds(pki["good"], "alice"), options=[("grpc.ssl_target_name_override", "elsewhere.example")]
    ) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/vflnet.v1.Coordinator/Join")(b"x", timeout=DEADLINE)
    err = info.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "Hostname Verification Check failed" in err.details()


def test_plaintext_caller_is_unauthenticated_but_health_is_open() -> None:
    recorder = Recorder()
    server, address = start_server(recorder, None)
    try:
        err = rpc_error(address, None, "/vflnet.v1.Coordinator/Join")
        assert healthcheck.main([address]) == 0
    finally:
        server.stop(grace=None)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "certificate" in err.details() and "/vflnet.v1.Coordinator/Join" in err.details()
    assert recorder.calls == []


def test_healthcheck_exit_codes(tls_server, pki, capsys) -> None:
    _, address = tls_server
    good = pki["good"]
    mtls = ["--ca", str(good / "ca.pem"), "--cert", str(good / "bob.pem"), "--key", str(good / "bob.key")]
    assert healthcheck.main([address, *mtls]) == 0
    assert "SERVING" in capsys.readouterr().out
    assert healthcheck.main([address, "--timeout", "2"]) == 1  # plaintext against a TLS server
    assert healthcheck.main([address, *mtls, "--service", "vflnet.v1.Nothing"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        healthcheck.main([address, "--ca", str(good / "ca.pem")])


def test_party_certificate_contents(tmp_path) -> None:
    tls.make_ca(tmp_path)
    files = tls.issue_party_cert(tmp_path, "passive-1", "passive", ["passive-1.lab", "10.0.0.7"])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["passive-1", "passive-1.lab", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.7"),
        ipaddress.ip_address("127.0.0.1"),
    ]
    assert tls.identity_from_pem(files.cert.read_bytes()) == tls.PeerIdentity("passive-1", "passive")
    assert tls.is_signed_by(files.cert, tmp_path / "ca.pem")
    assert files.key.stat().st_mode & 0o077 == 0
    with pytest.raises(FileExistsError):
        tls.make_ca(tmp_path)
    with pytest.raises(ValueError, match="role must be one of"):
        tls.issue_party_cert(tmp_path, "eve", "admin")


def test_authorizer_rejects_bad_tables() -> None:
    with pytest.raises(ValueError, match="unknown roles"):
        tls.RoleAuthorizer({"/vflnet.v1.Party/RunStep": {"root"}})
    with pytest.raises(ValueError, match="full method name"):
        tls.RoleAuthorizer({"RunStep": {"coordinator"}})


def test_certs_cli_is_idempotent(tmp_path, capsys) -> None:
    out = tmp_path / "certs"
    argv = ["--out", str(out), "--party", "coordinator:coordinator", "active:active:active.lab,10.1.2.3"]
    assert certs_cli.main(argv) == 0
    first = capsys.readouterr().out
    assert first.count("wrote") == 3
    ca_before = (out / "ca.pem").read_bytes()
    assert tls.identity_from_pem((out / "active.pem").read_bytes()) == tls.PeerIdentity("active", "active")

    assert certs_cli.main([*argv, "--party", "passive-1:passive"]) == 0
    second = capsys.readouterr().out
    assert second.count("kept") == 3 and second.count("wrote") == 1
    assert (out / "ca.pem").read_bytes() == ca_before

    assert certs_cli.main([*argv, "--force"]) == 0
    assert (out / "ca.pem").read_bytes() != ca_before
    assert not tls.is_signed_by(out / "passive-1.pem", out / "ca.pem")  # not re-listed, so not re-issued


def test_certs_cli_refuses_inconsistent_files(tmp_path, capsys) -> None:
    out = tmp_path / "certs"
    assert certs_cli.main(["--out", str(out), "--party", "bob:passive"]) == 0
    assert certs_cli.main(["--out", str(out), "--party", "bob:active"]) == 1
    assert "role passive" in capsys.readouterr().err
    foreign = tmp_path / "foreign"
    tls.make_ca(foreign)
    tls.issue_party_cert(foreign, "carol", "active", out_dir=out)
    assert certs_cli.main(["--out", str(out), "--party", "carol:active"]) == 1
    assert "not issued by" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        certs_cli.main(["--out", str(out), "--party", "dave:admin"])
    assert certs_cli.main(["--out", str(out), "--party", "x:active", "x:passive"]) == 2


def test_healthcheck_wait_until_serving() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.main([address]) == 1
        flip = threading.Timer(1.0, servicer.set, args=("", health_pb2.HealthCheckResponse.SERVING))
        flip.start()
        assert healthcheck.main([address, "--wait", "30"]) == 0
        flip.join()
    finally:
        server.stop(grace=None)


def test_a_channel_to_a_roster_party_accepts_only_that_partys_certificate(tls_server, pki) -> None:
    """Security finding 1: every party certificate also holds localhost, so checking the dialled host
    let a client reach whichever party answered; a channel opened for a roster peer checks its name."""
    from vflnet.wire.channels import open_channel

    good = pki["good"]
    transport = TransportConfig(tls=tls_in(good))
    _, address = tls_server  # serves with coord's certificate
    with open_channel(address, transport, "alice", peer="coord") as channel:
        assert channel.unary_unary("/vflnet.v1.Coordinator/Join")(b"x", timeout=DEADLINE) == b"alice/active"
    with open_channel(address, transport, "alice", peer="bob") as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/vflnet.v1.Coordinator/Join")(b"x", timeout=DEADLINE)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Hostname Verification Check failed" in info.value.details()


def test_certs_export_gives_each_party_only_its_own_files(tmp_path, capsys) -> None:
    """Security finding 8: the compose TLS overlay mounted the CA key and every party's key into every
    container; `vflnet certs --export` copies per party only what it may hold."""
    parties = ["--party", "coord:coordinator", "--party", "alice:active", "--party", "bob:passive"]
    assert (
        certs_cli.main(["--out", str(tmp_path / "ca"), "--export", str(tmp_path / "parties"), *parties]) == 0
    )
    for name in ("coord", "alice", "bob"):
        folder = tmp_path / "parties" / name
        assert sorted(p.name for p in folder.iterdir()) == sorted(["ca.pem", f"{name}.pem", f"{name}.key"])
        assert (folder / f"{name}.key").stat().st_mode & 0o077 == 0  # readable by its owner only
        assert tls.is_signed_by(folder / f"{name}.pem", folder / "ca.pem")
        assert (folder / f"{name}.key").read_bytes() == (tmp_path / "ca" / f"{name}.key").read_bytes()


def test_healthcheck_imports_little() -> None:
    """Compose and Kubernetes run the health check every few seconds in every container: it must not
    pull in cryptography, torch or the rest of vflnet (its cost is measured in docs/performance.md).
    The CLI's table of commands (vflnet/subcommands.py) imports only the standard library."""
    code = (
        "import sys, vflnet.cli, vflnet.wire.healthcheck; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cryptography', 'torch', 'numpy', 'yaml')"
        " or m.startswith('vflnet.') and m not in"
        " ('vflnet.cli', 'vflnet.subcommands', 'vflnet.wire', 'vflnet.wire.healthcheck')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_a_tls_server_knows_every_built_in_protocols_callers_without_importing_it() -> None:
    """A protocol's methods join the TLS permissions when its module is imported (its @handles): a
    process that builds a TLS server before importing its protocol must not refuse the protocol's
    methods for that reason (a fresh interpreter, so no test has imported split already)."""
    import subprocess
    import sys

    code = (
        "from vflnet.config import TLSConfig, TransportConfig\n"
        "from vflnet.wire.channels import make_server\n"
        "from vflnet.wire.permissions import ROLE_PERMISSIONS as P\n"
        "assert '/vflnet.v1.Active/ExchangeEmbeddings' not in P\n"
        "make_server(TransportConfig(tls=TLSConfig(enabled=True, ca='ca', cert='c', key='k')), 'p')\n"
        "print(sorted(P['/vflnet.v1.Active/ExchangeEmbeddings']), sorted(P['/vflnet.v1.Coordinator/Decrypt']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "['passive'] ['active', 'passive']"
