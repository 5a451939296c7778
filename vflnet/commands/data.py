"""`vflnet data split CONFIG --out DIR`: one file per party from the config's dataset, and the config
that points each party at its own file (docs/config.md, `parties[].source`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from vflnet.config import ConfigError, read_yaml
from vflnet.subcommands import add_action, run_action


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet data", description="a party's own data files")
    sub = parser.add_subparsers(dest="action", required=True)
    split = add_action(
        sub,
        "split",
        _split,
        "write one CSV per party from the config's dataset, DIR/NAME/NAME.csv (IDs as strings, rows "
        "shuffled per party, only the active party's file holds labels), and DIR/config.yaml pointing each "
        "party at its file",
    )
    split.add_argument("config", help="a run config over a built-in dataset")
    split.add_argument("--out", required=True, type=Path, help="folder of the files (created)")
    split.add_argument(
        "--overlap",
        type=float,
        default=0.7,
        help="share of the samples every party holds (the rest: all parties but one); default 0.7",
    )
    split.add_argument("--seed", type=int, default=0, help="seed of the overlap and of each file's row order")
    return parser


def main(argv: list[str]) -> int:
    return run_action(build_parser().parse_args(argv))


def _split(args: argparse.Namespace) -> int:
    from vflnet.data.sources import split_dataset  # these import torch: not for `--help`
    from vflnet.validation import load_config

    try:
        cfg = load_config(args.config)
        if cfg.sources:
            raise ConfigError(cfg.source, "parties", "the parties already read their own files")
        sections = split_dataset(cfg, args.out, args.overlap, args.seed)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"vflnet data split: {exc}", file=sys.stderr)
        return 2
    data = read_yaml(args.config)
    for party in data["parties"]:
        if party["name"] in sections:
            party.pop("features", None)
            party.pop("sample_fraction", None)
            party["source"] = sections[party["name"]]
    data.get("data", {}).pop("dataset", None)
    data.get("data", {}).pop("params", None)
    out = args.out / "config.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    for name, section in sections.items():
        print(f"{name}: {section['path']}")
    print(f"config: {out}")
    return 0
