"""`vflnet config`: check a config (`check`), write docs/config.md from the schema (`docs`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vflnet import docs_config
from vflnet.commands.arguments import add_overrides, parse_with_overrides
from vflnet.subcommands import add_action, run_action


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet config", description="config tools: check a config, write its docs"
    )
    sub = parser.add_subparsers(dest="config_command", required=True)
    check = add_action(sub, "check", _check, "validate a config file (with any KEY=VALUE overrides) and exit")
    check.add_argument("file", type=Path)
    add_overrides(check)
    text = "write docs/config.md from the schema (--check: only compare)"
    add_action(sub, "docs", _docs, text, add_help=False, parents=[docs_config.build_parser()])
    return parser


def main(argv: list[str]) -> int:
    return run_action(parse_with_overrides(build_parser(), argv))


def _docs(args: argparse.Namespace) -> int:
    return docs_config.write(args)


def _check(args: argparse.Namespace) -> int:
    from vflnet.validation import load_config  # imports torch: not for `--help`

    cfg = load_config(args.file, overrides=args.overrides)
    print(
        f"{args.file}: OK ({len(cfg.parties)} parties, protocol {cfg.protocol.kind}, "
        + ("the parties' own files" if cfg.sources else f"dataset {cfg.data.dataset}")
        + f", alignment {cfg.alignment.method})"
    )
    return 0
