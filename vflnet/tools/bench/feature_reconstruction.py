"""`vflnet bench feature-reconstruction`: Algorithm 1 (paper 000) seconds against d_A, per method.

Like the paper's Fig. 4 the input is random: n rows of d_A passive features (two Bernoulli columns,
the rest Gaussian) times a random W_A (k = 3 d_A), in float32 as it crosses the wire; each cell times
the search only (basis and M = A A'^-1 are shared). ``brute`` is the paper's enumeration (vectorised
in chunks); ``mitm`` is the exact meet-in-the-middle search. Both must return the same hits, and do on
every d_A where both run (the table says so). A brute cell that would take longer than ``--budget``
seconds is extrapolated like the paper's d_A = 29, 30 (f(d) = C 2^d d from the last measured cell)
and marked "~". Algorithm 2 (r = d_A + 1, one repeat) is timed the same way.

The paper (C++/Eigen, 32 vCPUs, n in {5000, 10000}) measured d_A = 10..28 and extrapolated 29, 30;
its seconds are only in the figure (Fig. 4a/4b, log scale), not in the text.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from vflnet.attacks import feature_reconstruction as fr
from vflnet.extras import require
from vflnet.tools.bench.common import parse_args, write_json


def planted(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Z_A (float32) for random passive data with two binary columns."""
    rng = np.random.default_rng([seed, d])
    x = np.hstack([(rng.random((n, 2)) < 0.3).astype(np.float64), rng.normal(size=(n, d - 2))])
    w = rng.normal(size=(3 * d, d)) / np.sqrt(d)
    return (x @ w.T).astype(np.float32)


def time_cell(n: int, d: int, method: str) -> tuple[float, int]:
    """(seconds, hits) of one search."""
    a, _ = fr.attack_basis(planted(n, d), rank=d)
    m, pivots = fr.solve_matrix(a)
    start = time.perf_counter()
    if method == "brute":
        hits = fr.search_brute(m)
    elif method == "mitm":
        hits = fr.search_mitm(m, pivots)
    else:
        res = fr.leverage_regression(a, d + 1, 1, np.random.default_rng(0))
        hits = np.array([res.normalized.any()])
    return time.perf_counter() - start, len(hits)


def run(
    n: int, dims: list[int], budget: float, alg2_max: int
) -> list[dict[str, float | int | str | bool | None]]:
    rows: list[dict[str, float | int | str | bool | None]] = []
    last_brute: tuple[int, float] | None = None
    last_alg2: tuple[int, float] | None = None
    for d in dims:
        row: dict[str, float | int | str | bool | None] = {"d_A": d}
        t_m, h_m = time_cell(n, d, "mitm")
        row["mitm_s"], row["mitm_hits"] = t_m, h_m
        guess = None if last_brute is None else last_brute[1] * 2 ** (d - last_brute[0]) * d / last_brute[0]
        if guess is None or guess <= budget:
            t_b, h_b = time_cell(n, d, "brute")
            row["brute_s"], row["brute_hits"], row["brute_extrapolated"] = t_b, h_b, False
            row["same_hits"] = h_b == h_m
            last_brute = (d, t_b)
        else:
            row["brute_s"], row["brute_extrapolated"], row["same_hits"] = guess, True, None
        guess2 = None if last_alg2 is None else last_alg2[1] * 2 ** (d - last_alg2[0]) * d / last_alg2[0]
        if d <= alg2_max and (guess2 is None or guess2 <= budget):
            t2, _ = time_cell(n, d, "alg2")
            row["alg2_s"], row["alg2_extrapolated"] = t2, False
            last_alg2 = (d, t2)
        elif guess2 is not None:
            row["alg2_s"], row["alg2_extrapolated"] = guess2, True
        rows.append(row)
        print(table_line(row), flush=True)
    return rows


def _fmt(row: dict, key: str) -> str:
    v = row.get(key)
    if v is None:
        return "-"
    mark = "~" if row.get(key.replace("_s", "_extrapolated")) else ""
    return f"{mark}{v:.3g}"


HEADER = "| d_A | brute (s) | mitm (s) | speed-up | same hits | Algorithm 2, 1 repeat (s) |\n|---|---|---|---|---|---|"


def table_line(row: dict) -> str:
    speed = float(row["brute_s"]) / max(float(row["mitm_s"]), 1e-9)  # type: ignore[arg-type]
    same = {True: "yes", False: "NO", None: "-"}[row.get("same_hits")]  # type: ignore[index]
    return (
        f"| {row['d_A']} | {_fmt(row, 'brute_s')} | {_fmt(row, 'mitm_s')} | {speed:.3g}x | {same} "
        f"| {_fmt(row, 'alg2_s')} |"
    )


def plot(rows: list[dict], n: int, path: Path) -> Path:
    require("matplotlib", "the benchmark's plot").use("Agg")
    plt = require("matplotlib.pyplot", "the benchmark's plot")

    fig, ax = plt.subplots(figsize=(6, 4))
    d = [r["d_A"] for r in rows]
    for key, label in (
        ("brute_s", "Algorithm 1, brute (paper's)"),
        ("mitm_s", "Algorithm 1, meet in the middle"),
        ("alg2_s", "Algorithm 2, 1 repeat"),
    ):
        pts = [
            (r["d_A"], r[key], r.get(key.replace("_s", "_extrapolated")))
            for r in rows
            if r.get(key) is not None
        ]
        ax.plot([p[0] for p in pts if not p[2]], [p[1] for p in pts if not p[2]], "o-", label=label)
        ext = [p for p in pts if p[2]]
        if ext:
            ax.plot([p[0] for p in ext], [p[1] for p in ext], "x--", color=ax.lines[-1].get_color())
    ax.set_yscale("log")
    ax.set_xlabel("d_A")
    ax.set_ylabel("seconds (x: extrapolated C 2^d d)")
    ax.set_title(f"paper 000 attack runtime, n = {n}, this machine")
    ax.set_xticks(d)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vflnet bench feature-reconstruction", description=__doc__)
    p.add_argument("--n", type=int, default=5000, help="rows (the paper: 5000 and 10000)")
    p.add_argument("--dims", type=int, nargs="+", default=[10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30])
    p.add_argument("--budget", type=float, default=60.0, help="seconds a measured cell may take")
    p.add_argument("--alg2-max", type=int, default=20, help="largest d_A for Algorithm 2")
    p.add_argument("--plot", type=Path, default=Path("runs/bench-feature-reconstruction.png"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(
        build_parser(), argv, smoke={"n": 1000, "dims": [10, 12], "budget": 1.0, "alg2_max": 10}
    )
    torch.set_num_threads(1)
    print(f"Algorithm 1 / 2 search seconds, n = {args.n}, float32 Z_A, this machine (~: extrapolated)")
    print(
        "paper 000 Fig. 4: C++/Eigen on 32 vCPUs, measured d_A = 10..28, 29-30 extrapolated (seconds only in the figure)"
    )
    print(HEADER)
    rows = run(args.n, args.dims, args.budget, args.alg2_max)
    print(f"plot: {plot(rows, args.n, args.plot)}")
    write_json(args.json, [{"n": args.n, **row} for row in rows])
    return 0
