"""`vflnet bench [NAME] [FLAGS]`: one benchmark (its module's own flags), or every one (`all`, the default:
vflnet.tools.bench.suite)."""

from __future__ import annotations

import argparse
import sys

from vflnet.runner.interrupt import INTERRUPTED_EXIT, interruptible
from vflnet.subcommands import Command, listing
from vflnet.tools.bench import BENCHMARKS


def build_parser() -> argparse.ArgumentParser:
    text = "benchmarks that print figures side by side"
    measures = listing(BENCHMARKS, 24, indent=2)
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
    command = (
        Command("vflnet.tools.bench.suite", "every benchmark")
        if args.what == "all"
        else BENCHMARKS[args.what]
    )
    # Ctrl-C and SIGTERM stop every benchmark alike: a run it started stops its processes (the signal
    # passed on), its scratch folder is removed, and `vflnet bench` all stops too, with one line
    try:
        with interruptible():
            return command.run(args.args)
    except KeyboardInterrupt:  # which signal: a run stopped by it reports only its exit code, 130
        print(f"\nbench {args.what} interrupted: no figures", file=sys.stderr)
        return INTERRUPTED_EXIT
