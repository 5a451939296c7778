"""Compile proto/vflnet/v1/*.proto into vflnet/v1/ (messages, gRPC stubs, type stubs).

Run with ``python -m vflnet.wire.codegen`` (or ``make proto``). ``--check`` regenerates into a
temporary folder and fails if the committed files differ: CI runs it so stale stubs never land.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
OUT_PACKAGE = Path("vflnet") / "v1"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "vflnet" / "v1").glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # imported here: only codegen needs grpcio-tools

    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    package = out_root / OUT_PACKAGE
    (package / "__init__.py").write_text(
        '"""Generated from proto/vflnet/v1 by vflnet.wire.codegen. Do not edit."""\n'
    )
    return sorted(p for p in package.iterdir() if p.is_file())


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            committed = REPO / OUT_PACKAGE / path.name
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(OUT_PACKAGE / path.name))
        extra = {p.name for p in (REPO / OUT_PACKAGE).glob("*_pb2*")} - {p.name for p in fresh}
        stale += [str(OUT_PACKAGE / n) for n in sorted(extra)]
    if stale:
        print("generated code is stale; run `make proto` and commit:", *stale, sep="\n  ", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    for path in generate(REPO):
        print("wrote", path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
