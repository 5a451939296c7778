"""VFLAIR's defense capability score (DCS) of a sweep's settings, for `vflnet report`.

Zou et al., "VFLAIR: A Research Library and Benchmark for Vertical Federated Learning" (ICLR 2024),
Eq. 1, and VFLAIR's "Metrics & Benchmark" guide: a defense at (AP, MP), attack performance and main-task
performance, scores DCS = 1 / (1 + D), D = sqrt((1 - beta) (AP - AP*)^2 + beta (MP - MP*)^2), its
distance from the ideal defense (AP*, MP*). VFLAIR weighs the two with beta = 0.5. The ideal here is
AP* = 0 (the attack recovers nothing) and MP* = 1 (the main task is solved): the best point on the
[0, 1] scales, the same for every setting, so scores compare across sweeps. DCS is 1 at the ideal.

AP is an attack's accuracy-type score (a metric whose name holds ``accuracy``, such as the label attacks'
``label_accuracy``: the share of labels recovered); MP is the run's utility column (``test_accuracy``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from vflnet.tools.experiments.results import setting_label

BETA = 0.5
IDEAL_ATTACK, IDEAL_UTILITY = 0.0, 1.0


def defense_capability_score(attack: float, utility: float, beta: float = BETA) -> float:
    """DCS of one (AP, MP) point; both in [0, 1], beta in [0, 1]."""
    for name, value in (("attack performance", attack), ("main-task performance", utility), ("beta", beta)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    distance = math.sqrt((1 - beta) * (attack - IDEAL_ATTACK) ** 2 + beta * (utility - IDEAL_UTILITY) ** 2)
    return 1.0 / (1.0 + distance)


def attack_performance_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The attack scores that are attack performance: accuracy-type metrics, every value in [0, 1]."""
    names = dict.fromkeys(k for row in rows for k in row if k.startswith("attack.") and "accuracy" in k)
    return [
        c
        for c in names
        if all(isinstance(r[c], int | float) and 0.0 <= r[c] <= 1.0 for r in rows if r.get(c) is not None)
    ]


def score_table(
    rows: list[dict[str, Any]], keys: list[str], utility: str
) -> tuple[list[str], list[list[float | str]]]:
    """Per setting (the mean over its seeds, in the sweep's order): runs, MP, and per attack AP and DCS."""
    attacks = attack_performance_columns(rows)
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(setting_label(row, keys), []).append(row)
    header = ["setting", "runs", f"MP: {utility}"]
    for attack in attacks:
        header += [f"AP: {attack}", f"DCS: {attack}"]
    table: list[list[float | str]] = []
    for label, members in groups.items():
        utilities = [m[utility] for m in members if isinstance(m.get(utility), int | float)]
        if not utilities:
            continue
        mp = statistics.fmean(utilities)
        line: list[float | str] = [label, str(len(members)), mp]
        for attack in attacks:
            values = [m[attack] for m in members if isinstance(m.get(attack), int | float)]
            ap = statistics.fmean(values) if values else None
            line += ["", ""] if ap is None else [ap, defense_capability_score(ap, mp)]
        table.append(line)
    return header, table
