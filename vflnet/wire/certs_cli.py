"""``vflnet certs``: make a run's CA and one certificate per party, skipping files that already exist.

Idempotent on purpose (like Flower's one-shot certs container): the compose ``certs`` service and
the lab guide run it on every start and it only fills in what is missing. An existing party
certificate that the current CA did not sign is an error, not a silent skip, since every TLS
handshake with it would fail later with a much vaguer message.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from vflnet.wire import tls


@dataclass(frozen=True)
class PartySpec:
    name: str
    role: str
    hosts: tuple[str, ...]


def parse_party(text: str) -> PartySpec:
    """``NAME:ROLE[:HOST,HOST...]`` -> PartySpec; argparse reports a bad value as a usage error."""
    parts = text.split(":", 2)
    if len(parts) < 2 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected NAME:ROLE[:HOST,HOST...], got {text!r}")
    name, role = parts[0], parts[1]
    if role not in tls.ROLES:
        raise argparse.ArgumentTypeError(f"{text!r}: role must be one of {', '.join(tls.ROLES)}")
    hosts = tuple(h for h in parts[2].split(",") if h) if len(parts) == 3 else ()
    return PartySpec(name, role, hosts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet certs",
        description="Create a CA and per-party mutual-TLS certificates (CN=name, OU=role).",
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="directory for ca.pem/ca.key and NAME.pem/NAME.key"
    )
    parser.add_argument(
        "--party",
        required=True,
        action="extend",
        nargs="+",
        type=parse_party,
        metavar="NAME:ROLE[:HOST,HOST]",
        help="a party to certify; its name, localhost and 127.0.0.1 are always in the SANs",
    )
    parser.add_argument(
        "--export",
        type=Path,
        help="also copy, per party, only what that party may hold into EXPORT/NAME/: ca.pem, NAME.pem, "
        "NAME.key (never the CA key, never another party's key)",
    )
    parser.add_argument("--days", type=int, default=365, help="validity of new certificates (default 365)")
    parser.add_argument("--force", action="store_true", help="replace existing CA and certificates")
    return parser


def _mismatch(cert: Path, ca_cert: Path, party: PartySpec) -> str | None:
    """Why an existing certificate cannot be kept for ``party`` (None if it can)."""
    if not tls.is_signed_by(cert, ca_cert):
        return f"{cert} was not issued by {ca_cert}"
    found = tls.identity_from_pem(cert.read_bytes())
    if found != tls.PeerIdentity(party.name, party.role):
        return f"{cert} is for {found.name!r} (role {found.role}), not {party.name!r} (role {party.role})"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [p.name for p in args.party]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        print(f"vflnet certs: party listed twice: {', '.join(duplicates)}", file=sys.stderr)
        return 2
    if "ca" in names:
        print("vflnet certs: 'ca' is reserved for the CA's own files", file=sys.stderr)
        return 2

    ca = tls.ca_files(args.out)
    new_ca = args.force or not (ca.cert.exists() and ca.key.exists())
    if new_ca:
        tls.make_ca(args.out, days=args.days, overwrite=True)
        print(f"wrote {ca.cert} and {ca.key}")
    else:
        print(f"kept {ca.cert}")

    for party in args.party:
        files = tls.party_files(args.out, party.name)
        if not new_ca and files.cert.exists() and files.key.exists():
            problem = _mismatch(files.cert, ca.cert, party)
            if problem:
                print(
                    f"vflnet certs: {problem}; rerun with --force to replace the CA and all certificates",
                    file=sys.stderr,
                )
                return 1
            print(f"kept {files.cert}")
            continue
        tls.issue_party_cert(args.out, party.name, party.role, party.hosts, days=args.days, overwrite=True)
        hosts = ", ".join(dict.fromkeys([party.name, *party.hosts, "localhost", "127.0.0.1"]))
        print(f"wrote {files.cert} and {files.key} (role {party.role}; hosts {hosts})")
    if args.export is not None:
        for party in args.party:
            export(args.out, party.name, args.export / party.name)
    return 0


def export(ca_dir: Path, name: str, out: Path) -> None:
    """Party ``name``'s own files (the CA certificate, its certificate and key) into ``out``, which
    then holds nothing else of the PKI: a party's container mounts only this."""
    out.mkdir(parents=True, exist_ok=True)
    files = tls.party_files(ca_dir, name)
    for src in (tls.ca_files(ca_dir).cert, files.cert, files.key):
        shutil.copy2(src, out / src.name)  # with its mode: keys stay readable by their owner only
    print(f"exported {name}'s ca.pem, {name}.pem and {name}.key to {out}")


if __name__ == "__main__":
    sys.exit(main())
