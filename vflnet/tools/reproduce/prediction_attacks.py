"""`vflnet reproduce prediction-attacks`: paper 003's attacks on prediction outputs, from real runs.

Every cell is a run over the loopback bridge (the protocols' own code, one process): the model is
trained through a VFL protocol (`split` for logistic regression and the NN, `secureboost` for the
trees), the passive party releases its model to the active party at the end (paper 003's threat
model), the prediction phase delivers the confidence vectors of the held-out samples to the active
party, and the attack there computes from those alone; the runner scores it against the passive
party's true features. The two-party case (P_adv = the active party, P_target = the passive party)
is the paper's strongest setting. Features are min-max normalised into [0, 1] as in the paper.

Datasets: the paper's two synthetic sets (Table II: 25 features / 10 classes, 50 / 5) at reduced n,
and bundled substitutes for its real sets, which are not available offline: breast_cancer (30
features, 2 classes) for Bank marketing (20, 2) in Table III, wine (13, 3) as a small multi-class set.
Feature assignment: a seeded permutation per trial, the last d_target columns are the target's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vflnet import progress
from vflnet.data.datasets import load_dataset
from vflnet.metrics.intervals import mean_ci
from vflnet.runner.local import run_local
from vflnet.tools.reproduce import add_size_flags

FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


def datasets(n: int) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "synthetic-1": (
            "synthetic",
            {"n_samples": n, "n_features": 25, "n_informative": 10, "n_redundant": 10, "n_classes": 10},
        ),
        "synthetic-2": (
            "synthetic",
            {"n_samples": n, "n_features": 50, "n_informative": 10, "n_redundant": 20, "n_classes": 5},
        ),
        "breast_cancer": ("breast_cancer", {}),
        "wine": ("wine", {}),
    }


def config(
    dataset: tuple[str, dict[str, Any]],
    fraction: float,
    seed: int,
    model: str,
    attacks: list[dict[str, Any]],
    defenses: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], int, int]:
    """Two parties; `model`: lr (split, linear bottoms summed), nn (split, MLP bottoms, MLP top), dt
    (secureboost decision tree, depth 5), rf (secureboost forest, 100 trees of depth 3)."""
    data = load_dataset(*dataset)
    d, c = int(np.prod(data.features.shape[1:])), data.n_classes
    d_target = max(1, round(fraction * d))
    perm = np.random.default_rng(seed).permutation(d)
    cols = {"active": sorted(perm[:-d_target].tolist()), "passive-1": sorted(perm[-d_target:].tolist())}
    bottom: dict[str, Any]
    protocol: dict[str, Any]
    train: dict[str, Any] = {"epochs": 10, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 0.01}}
    top: dict[str, Any] = {"kind": "none"}
    if model == "lr":
        bottom, protocol = (
            {"kind": "linear", "bias": False, "out": c},
            {"kind": "split", "aggregation": "sum"},
        )
    elif model in ("nn", "nn-dropout"):  # paper: 600-300-100 hidden; here bottoms 600-300, the top 100
        rate = 0.5 if model == "nn-dropout" else 0.0  # the rate is not in the paper: PyTorch's default
        bottom = {"kind": "mlp", "hidden": [600], "out": 300, "dropout": rate}
        protocol = {"kind": "split", "aggregation": "concat"}
        top = {"kind": "mlp", "hidden": [100], "dropout": rate}
    else:
        bottom = {"kind": "splits", "out": c}
        depth = 5 if model == "dt" else 3
        params = {"mode": "plain", "max_depth": depth, "ensemble": "forest"}
        protocol = {"kind": "secureboost", "aggregation": "sum", "params": params}
        # rf: 100 trees, one per epoch, each over a random 80% of the training rows
        n_train = int(len(data.labels) * 0.7)
        train = (
            {"epochs": 1, "batch_size": 10**9}
            if model == "dt"
            else {"epochs": 100, "batch_size": int(0.8 * n_train), "drop_last": True, "eval_every": 100}
        )
    parties = [{"name": "coordinator", "role": "coordinator"}] + [
        {
            "name": n,
            "role": "active" if n == "active" else "passive",
            "features": {"columns": cols[n]},
            "bottom": bottom,
        }
        for n in ("active", "passive-1")
    ]
    return (
        {
            "run": {"seed": seed},
            "protocol": protocol,
            "data": {
                "dataset": dataset[0],
                "params": dataset[1],
                "normalize": "minmax",
                "test_fraction": 0.3,
            },
            "parties": parties,
            "model": {"top": top},
            "train": train,
            "predict": {"set": "test", "batch_size": 256},
            "model_release": [
                {"owner": "passive-1", "recipient": "active", "modules": ["bottom"], "when": "end"}
            ],
            "attacks": attacks,
            "defenses": defenses or [],
            "transport": {"bridge": "loopback"},
        },
        d_target,
        c,
    )


def run_case(out_dir: Path, name: str, data: dict[str, Any]) -> dict[str, dict[str, float]]:
    data["run"].update(dir=str(out_dir), id=name)
    path = out_dir / f"{name}.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    if run_local(path, run_dir=out_dir / name, progress=False) != 0:
        raise RuntimeError(f"run {name} failed; see {out_dir / name}/logs")
    progress.advance(name)
    return json.loads((out_dir / name / "attacks/scores.json").read_text())


def esa_table(out_dir: Path, sets: dict, seeds: list[int]) -> str:
    lines = [
        "| dataset (d, c) | "
        + " | ".join(f"{int(f * 100)}%" for f in FRACTIONS)
        + " | random U(0,1) | random N(0.5, 0.25^2) |",
        "|---|" + "---|" * (len(FRACTIONS) + 2),
    ]
    for name, ds in sets.items():
        cells, uni, gau = [], [], []
        for f in FRACTIONS:
            mse, bound = [], []
            for seed in seeds:
                data, d_t, c = config(ds, f, seed, "lr", [{"name": "esa", "party": "active"}])
                s = run_case(out_dir, f"esa-{name}-{int(f * 100)}-{seed}", data)["esa@active"]
                mse.append(s["mse"])
                bound.append(s["upper_bound"])
                uni.append(s["mse_uniform"])
                gau.append(s["mse_gaussian"])
            exact = " T" if d_t <= c - 1 else ""
            cells.append(f"{np.mean(mse):.2g}{exact} (d_t={d_t}; bound {np.mean(bound):.2f})")
        d = load_dataset(*ds)
        lines.append(
            f"| {name} ({int(np.prod(d.features.shape[1:]))}, {d.n_classes}) | "
            + " | ".join(cells)
            + f" | {np.mean(uni):.3f} | {np.mean(gau):.3f} |"
        )
    return "\n".join(lines)


def rounding_table(out_dir: Path, ds: tuple, seeds: list[int]) -> str:
    lines = ["| rounding b | ESA MSE (LR) | GRNA MSE (LR) | random U(0,1) |", "|---|---|---|---|"]
    for b in (None, 3, 2, 1):
        esa, grna, uni = [], [], []
        for seed in seeds:
            defenses = (
                [] if b is None else [{"name": "round-scores", "party": "active", "params": {"decimals": b}}]
            )
            for attack, acc in (("esa", esa), ("grna", grna)):
                data, _, _ = config(ds, 0.3, seed, "lr", [{"name": attack, "party": "active"}], defenses)
                s = run_case(out_dir, f"round-{attack}-{b}-{seed}", data)[f"{attack}@active"]
                acc.append(s["mse"])
                uni.append(s["mse_uniform"])
        lines.append(
            f"| {'none' if b is None else b} | {np.mean(esa):.3g} | {np.mean(grna):.4f} | {np.mean(uni):.4f} |"
        )
    return "\n".join(lines)


PAPER_TABLE_III = {1: 0.1705, 2: 0.1514, 3: 0.1474, 4: 0.2862, 5: 0.1216, 6: 0.2459}


def _cell(values: list[float]) -> str:
    mean, half = mean_ci(values)
    return f"{mean:.4f}" if np.isnan(half) else f"{mean:.4f} ± {half:.4f}"


def ablation_table(
    out_dir: Path, ds: tuple, seeds: list[int], epochs: int, results: dict[str, Any] | None = None
) -> str:
    """Table III. Every case runs on the same trials (seed: feature split, data split, GRNA seed), so
    a case's difference from the full GRN is also given paired, trial by trial. `results` gets the
    per-trial MSEs and the intervals (the JSON beside the report)."""
    cases = {
        1: ("no x_adv input", {"use_x_adv": False}),
        2: ("no noise input", {"use_noise": False}),
        3: ("no variance constraint", {"lambda_var": 0.0}),
        4: ("naive regression (no generator)", {"naive": True}),
        5: ("full GRN", {}),
    }
    mse: dict[int, list[float]] = {case: [] for case in cases}
    uni: list[float] = []  # the U(0,1) guess depends on the trial only: one value per seed
    for case, (_, params) in cases.items():
        for seed in seeds:
            attack = {"name": "grna", "party": "active", "params": {"epochs": epochs, "seed": seed, **params}}
            data, _, _ = config(ds, 0.4, seed, "lr", [attack])
            s = run_case(out_dir, f"ablation-{case}-{seed}", data)["grna@active"]
            mse[case].append(s["mse"])
            if case == 5:
                uni.append(s["mse_uniform"])
    mse[6] = uni
    names = {**{case: what for case, (what, _) in cases.items()}, 6: "random guess U(0,1)"}
    lines = [
        f"| case | what | MSE here (mean ± 95% CI, {len(seeds)} trial{'s' if len(seeds) != 1 else ''}) | minus full GRN (paired) | paper (Bank, LR, 40%) |",
        "|---|---|---|---|---|",
    ]
    rows = {}
    for case, what in names.items():
        diff = [a - b for a, b in zip(mse[case], mse[5], strict=True)]
        mean, half = mean_ci(mse[case])
        d_mean, d_half = mean_ci(diff)
        rows[str(case)] = {  # with one trial there is no interval: null
            "what": what,
            "mse": mse[case],
            "mean": mean,
            "std": float(np.std(mse[case], ddof=1)) if len(seeds) > 1 else None,
            "ci95": None if np.isnan(half) else half,
            "minus_full_grn": {"mean": d_mean, "ci95": None if np.isnan(d_half) else d_half},
            "paper": PAPER_TABLE_III[case],
        }
        lines.append(
            f"| {case} | {what} | {_cell(mse[case])} | {'-' if case == 5 else _cell(diff)} | {PAPER_TABLE_III[case]} |"
        )
    if results is not None:
        results["ablation"] = {
            "trials": len(seeds),
            "seeds": seeds,
            "epochs": epochs,
            "level": 0.95,
            "cases": rows,
        }
    return "\n".join(lines)


def correlation_table(out_dir: Path, ds: tuple, seed: int, epochs: int) -> str:
    """Per target feature: GRNA's MSE beside its correlations with x_adv and v (Eqs. 16-17, Fig. 10)."""
    from vflnet.attacks.prediction_base import target_truth
    from vflnet.metrics.features import correlation_diagnostics
    from vflnet.runner.scoring import ground_truth
    from vflnet.validation import config_from_dict

    attack = {"name": "grna", "party": "active", "params": {"epochs": epochs, "seed": seed}}
    data, _, _ = config(ds, 0.4, seed, "lr", [attack])
    run_case(out_dir, f"correlation-{seed}", data)
    with np.load(out_dir / f"correlation-{seed}" / "attacks/grna@active.npz") as f:
        out = {k: f[k] for k in f.files}
    truth = target_truth(ground_truth(config_from_dict(data), "normalized-features"), out["sample_ids"])
    with_adv, with_v = correlation_diagnostics(out["x_adv"], out["confidence"], truth)
    mse = ((out["x_target"] - truth) ** 2).mean(0)
    lines = ["| target feature | GRNA MSE | corr(x_adv, x_i) | corr(v, x_i) |", "|---|---|---|---|"]
    for i in np.argsort(mse):
        lines.append(f"| {i} | {mse[i]:.4f} | {with_adv[i]:.3f} | {with_v[i]:.3f} |")
    r = np.corrcoef(mse, with_adv + with_v)[0, 1]
    lines.append(
        f"\nPearson r between a feature's MSE and its two correlations summed: {r:.2f} (the paper: weaker correlations, larger error)."
    )
    return "\n".join(lines)


def pra_table(out_dir: Path, sets: dict, seeds: list[int]) -> str:
    lines = [
        "| dataset (d, c) | " + " | ".join(f"{int(f * 100)}%" for f in FRACTIONS) + " |",
        "|---|" + "---|" * len(FRACTIONS),
    ]
    for name, ds in sets.items():
        cells = []
        for f in FRACTIONS:
            cbr, rnd = [], []
            for seed in seeds:
                data, d_t, _ = config(
                    ds, f, seed, "dt", [{"name": "pra", "party": "active", "params": {"seed": seed}}]
                )
                s = run_case(out_dir, f"pra-{name}-{int(f * 100)}-{seed}", data)["pra@active"]
                if s["branches"]:  # else the tree never splits on the target's features
                    cbr.append(s["cbr"])
                    rnd.append(s["cbr_random"])
            cells.append(f"{np.mean(cbr):.3f} / {np.mean(rnd):.3f}" if cbr else "no target split")
        d = load_dataset(*ds)
        lines.append(
            f"| {name} ({int(np.prod(d.features.shape[1:]))}, {d.n_classes}) | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def grna_models_table(out_dir: Path, sets: dict, seeds: list[int], epochs: int) -> str:
    lines = [
        "| dataset | model | d_target | GRNA MSE | random U(0,1) | random N(0.5, 0.25^2) | RF: CBR / U(0,1) guess's |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, ds in sets.items():
        for model in ("lr", "nn", "nn-dropout", "rf"):
            mse, uni, gau, dts, cbr = [], [], [], [], []
            for seed in seeds:
                attack = {"name": "grna", "party": "active", "params": {"epochs": epochs, "seed": seed}}
                if model.startswith("nn"):
                    attack["params"]["aggregation"] = "concat"
                data, d_t, _ = config(ds, 0.3, seed, model, [attack])
                s = run_case(out_dir, f"grna-{model}-{name}-{seed}", data)["grna@active"]
                if "cbr" in s:
                    cbr.append(f"{s['cbr']:.3f} / {s['cbr_uniform']:.3f}")
                mse.append(s["mse"])
                uni.append(s["mse_uniform"])
                gau.append(s["mse_gaussian"])
                dts.append(d_t)
            lines.append(
                f"| {name} | {model} | {dts[0]} | {np.mean(mse):.4f} | {np.mean(uni):.4f} | {np.mean(gau):.4f} | {', '.join(cbr) or '-'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet reproduce prediction-attacks", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("runs/reproduce-prediction-attacks"))
    add_size_flags(
        parser,
        quick="one trial, n = 1000, fewer GRNA epochs",
        smoke="the Table III ablation only, one trial, 3 GRNA epochs",
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--tables",
        default="",
        help="a subset, e.g. esa,pra (esa, rounding, ablation, models, correlations, pra)",
    )
    parser.add_argument("--n", type=int, default=3000, help="samples of each synthetic set (paper: 100,000)")
    parser.add_argument("--epochs", type=int, default=60, help="GRNA epochs (the authors' code: 60)")
    args = parser.parse_args(argv)
    seeds = list(range(1 if args.quick or args.smoke else args.trials))
    n, epochs = (1000, 20) if args.quick else (1000, 3) if args.smoke else (args.n, args.epochs)
    sets = datasets(n)
    out = args.out_dir
    results: dict[str, Any] = {}  # per-trial values and intervals, results.json
    sections: dict[str, tuple[str, Callable[[], str]]] = {
        "esa": (
            "ESA: MSE per feature vs the target's share of the features (LR; T: d_target <= c - 1, where the paper gets 0)",
            lambda: esa_table(out, sets, seeds),
        ),
        "rounding": (
            "ESA and GRNA against rounding the released scores (synthetic-1, 30%; paper Fig. 11a-d)",
            lambda: rounding_table(out, sets["synthetic-1"], seeds),
        ),
        "ablation": (
            "GRNA ablation, Table III (breast_cancer for Bank marketing; LR, 40% target)",
            lambda: ablation_table(out, sets["breast_cancer"], seeds, epochs, results),
        ),
        "models": (
            "GRNA on LR, NN (with dropout 0.5: paper Fig. 11e-f) and RF through an imitating NN (30% target; paper Fig. 7)",
            lambda: grna_models_table(
                out, {k: sets[k] for k in ("synthetic-1", "breast_cancer")}, seeds, epochs
            ),
        ),
        "correlations": (
            f"GRNA per target feature against its correlations (breast_cancer, LR, 40%, {epochs} epochs; paper Fig. 10, Eqs. 16-17)",
            lambda: correlation_table(out, sets["breast_cancer"], seeds[0], epochs),
        ),
        "pra": (
            "PRA: CBR / random-path CBR vs the target's share (decision tree depth 5 over secureboost; paper Fig. 6)",
            lambda: pra_table(out, sets, seeds),
        ),
    }
    wanted = ["ablation"] if args.smoke else args.tables.split(",") if args.tables else list(sections)
    if unknown := set(wanted) - set(sections):
        parser.error(f"--tables: unknown {sorted(unknown)}; choose from {','.join(sections)}")
    report = "\n\n".join(f"### {title}\n\n{table()}" for title, table in (sections[k] for k in wanted))
    report += f"\n\n{len(seeds)} trial(s) per cell; synthetic n = {n}; GRNA {epochs} epochs.\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    if results:
        (out / "results.json").write_text(json.dumps(results, indent=2))
    print(report)
    print(f"\nreport written to {out / 'report.md'}")
    return 0
