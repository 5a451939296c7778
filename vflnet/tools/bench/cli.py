"""`vflnet bench [NAME] [FLAGS]`: one benchmark (its module's own flags), or every one (`all`, the default:
vflnet.tools.bench.suite)."""

from __future__ import annotations

import argparse
import importlib
import sys

from vflnet.runner.interrupt import INTERRUPTED_EXIT, interruptible
from vflnet.tools.bench import BENCHMARKS


def build_parser() -> argparse.ArgumentParser:
    text = "benchmarks that print figures side by side"
    measures = "\n".join(f"  {name:<24}{what}" for name, (_, what) in BENCHMARKS.items())
    parser = argparse.ArgumentParser(
        prog="vflnet bench",
        description=f"{text}; no name (or all): every one, into one JSON and one Markdown file (--smoke: "
        f"tiny sizes, --out DIR).\n\nwhat each measures:\n{measures}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "what", nargs="?", default="all", choices=[*BENCHMARKS, "all"], help="a benchmark (below)"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's flags (NAME --help)")
    return parser


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["all", *argv]  # `vflnet bench --smoke`: flags of `all`, not a benchmark's name
    args = build_parser().parse_args(argv)
    module = "vflnet.tools.bench.suite" if args.what == "all" else BENCHMARKS[args.what][0]
    # Ctrl-C and SIGTERM stop every benchmark alike: a run it started stops its processes (the signal
    # passed on), its scratch folder is removed, and `vflnet bench` all stops too, with one line
    try:
        with interruptible():
            return int(importlib.import_module(module).main(args.args) or 0)
    except KeyboardInterrupt:  # which signal: a run stopped by it reports only its exit code, 130
        print(f"\nbench {args.what} interrupted: no figures", file=sys.stderr)
        return INTERRUPTED_EXIT
