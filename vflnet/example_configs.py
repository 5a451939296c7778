"""`vflnet examples [DIR]`: copy the example configs shipped in the package (vflnet/examples, which the
repository's configs/ links to) into DIR, never overwriting a file."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent / "examples"


def example_files() -> list[Path]:
    """Every shipped example (run configs and sweep files), relative to :data:`EXAMPLES`."""
    return sorted(p.relative_to(EXAMPLES) for p in EXAMPLES.rglob("*.yaml"))


def copy_examples(dest: Path) -> int:
    """Copy every example into ``dest`` (its folders kept: a sweep's relative ``base`` still resolves);
    exit code 1 and nothing copied when any of them already exists there."""
    files = example_files()
    existing = [dest / f for f in files if (dest / f).exists()]
    if existing:
        names = ", ".join(str(p) for p in existing)
        print(f"vflnet examples: not overwriting {names}; nothing copied", file=sys.stderr)
        return 1
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(EXAMPLES / f, dest / f)
    print(f"wrote {len(files)} example files to {dest}: {', '.join(str(f) for f in files)}")
    print(f"try: vflnet run {dest / 'digits-2p.yaml'} train.epochs=3")
    return 0


def build_parser() -> argparse.ArgumentParser:
    text = "copy the example configs (and sweep files) shipped with vflnet into a folder"
    parser = argparse.ArgumentParser(prog="vflnet examples", description=f"{text}; never overwrites a file")
    parser.add_argument(
        "dir", type=Path, nargs="?", default=Path("vflnet-examples"), help="default: ./vflnet-examples"
    )
    return parser


def main(argv: list[str]) -> int:
    return copy_examples(build_parser().parse_args(argv).dir)
