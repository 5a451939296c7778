"""Transport security: a small CA, per-party certificates, mutual TLS and role-based authorization.

Every vflnet process is both a gRPC server and a client, so one certificate per party serves both
ends (extended key usage serverAuth + clientAuth). Identity lives in the certificate, never in
request metadata a caller could forge:

- the party **name** is the subject common name (CN);
- the party **role** (``coordinator``, ``active`` or ``passive``) is the subject organizational
  unit (OU). The certificate is signed by the run's CA, so a party cannot pick its own role;
- the subject alternative names hold the hosts the party serves on (DNS names and IP addresses),
  always including the party name itself (compose/k8s service names equal party names),
  ``localhost`` and ``127.0.0.1``, so a client's hostname check passes on every deployment shape.

Files on disk: ``ca.pem``/``ca.key`` for the CA, ``NAME.pem``/``NAME.key`` for a party (PEM; keys
are written with mode 0600). Keys are ECDSA P-256: fast to generate and supported by gRPC's TLS.

``RoleAuthorizer`` is a server interceptor: a caller without a TLS identity is answered
UNAUTHENTICATED, a caller whose role may not call the method PERMISSION_DENIED (naming caller,
role and method); either way only that call fails and the server keeps serving.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vflnet.wire.permissions import ROLE_PERMISSIONS

ROLES = ("coordinator", "active", "passive")
CA_CERT = "ca.pem"
CA_KEY = "ca.key"

# Services any caller may reach: readiness probes must work without knowing the run's roles.
OPEN_SERVICES = frozenset({"grpc.health.v1.Health"})


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class PeerIdentity:
    name: str
    role: str


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only (created with 0600, never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, files: CertFiles) -> CertFiles:
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        files.key,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return files


def _refuse_overwrite(files: CertFiles, overwrite: bool) -> None:
    existing = [str(p) for p in (files.cert, files.key) if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"refusing to overwrite {', '.join(existing)} (pass overwrite=True)")


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    # Backdated a little so hosts with slightly skewed clocks accept a freshly issued certificate.
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)


def ca_files(ca_dir: str | Path) -> CertFiles:
    ca_dir = Path(ca_dir)
    return CertFiles(ca_dir / CA_CERT, ca_dir / CA_KEY)


def party_files(out_dir: str | Path, name: str) -> CertFiles:
    out_dir = Path(out_dir)
    return CertFiles(out_dir / f"{name}.pem", out_dir / f"{name}.key")


def make_ca(
    out_dir: str | Path, *, common_name: str = "vflnet CA", days: int = 365, overwrite: bool = False
) -> CertFiles:
    """Create a self-signed CA in ``out_dir`` (``ca.pem``, ``ca.key``); it signs every party of a run."""
    files = ca_files(out_dir)
    files.cert.parent.mkdir(parents=True, exist_ok=True)
    _refuse_overwrite(files, overwrite)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write_pair(cert, key, files)


def _san_entries(name: str, hosts: Iterable[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in [name, *hosts, "localhost", "127.0.0.1"]:
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return entries


def issue_party_cert(
    ca_dir: str | Path,
    name: str,
    role: str,
    hosts: Iterable[str] = (),
    *,
    out_dir: str | Path | None = None,
    days: int = 365,
    overwrite: bool = False,
) -> CertFiles:
    """Sign a certificate for party ``name`` with ``role`` (CN=name, OU=role); written as NAME.pem/.key.

    ``hosts`` are extra DNS names or IP addresses the party serves on; ``out_dir`` defaults to
    ``ca_dir``.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not name or "/" in name:
        raise ValueError(f"party name must be non-empty and contain no '/', got {name!r}")
    ca = ca_files(ca_dir)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key} is not an EC private key made by make_ca")
    files = party_files(ca_dir if out_dir is None else out_dir, name)
    files.cert.parent.mkdir(parents=True, exist_ok=True)
    _refuse_overwrite(files, overwrite)
    key = _new_key()
    not_before, not_after = _validity(days)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, name),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_san_entries(name, hosts)), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _write_pair(cert, key, files)


def identity_from_pem(pem: bytes) -> PeerIdentity:
    """Name (CN) and role (OU) of a party certificate; ValueError if either is missing or ambiguous."""
    subject = x509.load_pem_x509_certificate(pem).subject
    names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    roles = subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(names) != 1 or len(roles) != 1:
        raise ValueError(f"certificate subject {subject.rfc4514_string()} needs exactly one CN and one OU")
    return PeerIdentity(name=str(names[0].value), role=str(roles[0].value))


def is_signed_by(cert_path: str | Path, ca_cert_path: str | Path) -> bool:
    """True if the certificate was issued by this CA (checks the signature, not just the names)."""
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    ca = x509.load_pem_x509_certificate(Path(ca_cert_path).read_bytes())
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


PemSource = str | Path | bytes  # a file path, or the PEM bytes themselves


def _read(source: PemSource) -> bytes:
    return source if isinstance(source, bytes) else Path(source).read_bytes()


def server_credentials(ca: PemSource, cert: PemSource, key: PemSource) -> grpc.ServerCredentials:
    """Mutual TLS for a server: clients must present a certificate signed by ``ca`` (paths or PEM bytes)."""
    return grpc.ssl_server_credentials(
        [(_read(key), _read(cert))], root_certificates=_read(ca), require_client_auth=True
    )


def channel_credentials(ca: PemSource, cert: PemSource, key: PemSource) -> grpc.ChannelCredentials:
    """Mutual TLS for a client: trusts only ``ca`` and presents this party's certificate (paths or PEM bytes)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca), private_key=_read(key), certificate_chain=_read(cert)
    )


def peer_identity(context: grpc.ServicerContext) -> PeerIdentity | None:
    """The calling party's identity from its verified TLS certificate; None on a plaintext channel."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert") or []
    if len(pems) != 1:
        return None
    try:
        return identity_from_pem(pems[0])
    except ValueError:
        return None


def _wrap_handler(handler: grpc.RpcMethodHandler, check: Callable[[grpc.ServicerContext], None]) -> Any:
    """Same handler, with ``check`` run before the servicer; covers all four call shapes."""

    def guard(
        behavior: Callable[[Any, grpc.ServicerContext], Any],
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            return behavior(request, context)

        return guarded

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(guard(handler.unary_unary), **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(guard(handler.unary_stream), **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(guard(handler.stream_unary), **codec)
    return grpc.stream_stream_rpc_method_handler(guard(handler.stream_stream), **codec)


class RoleAuthorizer(grpc.ServerInterceptor):
    """Lets a call through only if the caller's certificate role may call that method.

    Methods absent from ``allowed`` are refused too (a new RPC without a permission entry fails
    loudly instead of being open), except those of ``open_services`` such as the health service.
    ``allowed`` defaults to vflnet's permissions (vflnet/wire/permissions.py), every built-in
    protocol's included.
    """

    def __init__(
        self,
        allowed: Mapping[str, Iterable[str]] | None = None,
        open_services: Iterable[str] = OPEN_SERVICES,
    ) -> None:
        if allowed is None:
            from vflnet.registry import PROTOCOLS

            # a protocol's methods join the permissions when its module is imported (its @handles):
            # load every built-in first, so that no method is refused because this process has not
            # imported its protocol yet (plug-ins load with the config, `plugins:`)
            PROTOCOLS.names()
            allowed = ROLE_PERMISSIONS
        self.allowed = {method: frozenset(roles) for method, roles in allowed.items()}
        for method, roles in self.allowed.items():
            if not method.startswith("/") or method.count("/") != 2:
                raise ValueError(
                    f"permission key must be a full method name like /pkg.Service/Method, got {method!r}"
                )
            unknown = roles - set(ROLES)
            if unknown:
                raise ValueError(
                    f"{method}: unknown roles {sorted(unknown)}; known roles are {', '.join(ROLES)}"
                )
        self.open_services = frozenset(open_services)

    def check(self, method: str, context: grpc.ServicerContext) -> None:
        """Abort the call (raises) unless the caller's certificate role is allowed on ``method``."""
        peer = peer_identity(context)
        if peer is None:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method} needs a client TLS certificate issued by the run's CA; the caller presented none",
            )
        roles = self.allowed.get(method)
        if roles is None:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"party {peer.name!r} (role {peer.role}) may not call {method}: the method has no permission entry",
            )
        if peer.role not in roles:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"party {peer.name!r} (role {peer.role}) may not call {method}; "
                f"allowed roles: {', '.join(sorted(roles))}",
            )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.split("/")[1] in self.open_services:
            return handler
        return _wrap_handler(handler, lambda context: self.check(method, context))
