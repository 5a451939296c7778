"""The report's plots, as PNG bytes (matplotlib's Agg canvas: no display, no pyplot global state).

Each function takes one or more labelled series so a comparison draws two runs or sweeps on the same
axes with the code that draws one. Without matplotlib (the plots extra) each returns NotDrawn, saying
so: a report's tables need no plotting."""

from __future__ import annotations

import functools
import io
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any, ParamSpec

from vflnet.extras import MissingExtra, agg_figure
from vflnet.tools.experiments.document import NotDrawn
from vflnet.tools.experiments.results import setting_label

Records = list[dict[str, Any]]  # metrics.jsonl
Rows = list[dict[str, Any]]  # results table rows
MAX_LEGEND = 12


P = ParamSpec("P")


def plot(draw: Callable[P, bytes]) -> Callable[P, bytes | NotDrawn]:
    """A plot of the report: its PNG, or NotDrawn with the extra to install when matplotlib is missing."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> bytes | NotDrawn:
        try:
            return draw(*args, **kwargs)
        except MissingExtra as exc:
            return NotDrawn(str(exc))

    return drawn


def _figure(**kwargs: Any) -> Any:
    return agg_figure("drawing the report's figures", **kwargs)


def _png(fig: Any) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")  # "tight": the legend outside the axes
    return buf.getvalue()


@plot
def training_curves(runs: dict[str, Records]) -> bytes:
    """Loss and accuracy per step (train batches), with the test figures at each evaluated epoch."""
    fig = _figure(figsize=(10, 3.6))
    loss_ax, acc_ax = fig.subplots(1, 2)
    for label, records in runs.items():
        steps = [r for r in records if r["kind"] == "step"]
        tested = [
            (r, _last_step(records, r["epoch"])) for r in records if r["kind"] == "epoch" and "test_loss" in r
        ]
        line = loss_ax.plot(
            [s["step"] for s in steps], [s["loss"] for s in steps], lw=1, label=f"{label} train"
        )
        acc_ax.plot(
            [s["step"] for s in steps], [s["accuracy"] for s in steps], lw=1, color=line[0].get_color()
        )
        if tested:
            at = [step for _, step in tested]
            loss_ax.plot(
                at,
                [e["test_loss"] for e, _ in tested],
                "o--",
                color=line[0].get_color(),
                label=f"{label} test",
            )
            acc_ax.plot(at, [e["test_accuracy"] for e, _ in tested], "o--", color=line[0].get_color())
    loss_ax.set(xlabel="step", ylabel="loss", title="loss")
    acc_ax.set(xlabel="step", ylabel="accuracy", title="accuracy (lines: batches, dots: test)")
    _legend(acc_ax, len(runs), loss_ax)
    return _png(fig)


def _legend(ax: Any, n_series: int, source: Any = None) -> None:
    """The legend of ``source``'s lines (default: ``ax``'s) right of ``ax``, outside the data; none past
    MAX_LEGEND series (the tables name the runs)."""
    if n_series <= MAX_LEGEND:
        handles, labels = (source or ax).get_legend_handles_labels()
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def _last_step(records: Records, epoch: int) -> int:
    return max((r["step"] for r in records if r["kind"] == "step" and r["epoch"] == epoch), default=0)


@plot
def bytes_per_type(runs: dict[str, dict[str, float]]) -> bytes:
    """Mean bytes per training step of each message type (sender/method), one bar group per run."""
    types = sorted({t for per_type in runs.values() for t in per_type})
    fig = _figure(figsize=(10, 0.5 + 0.45 * len(types) * len(runs) + 0.6))
    ax = fig.subplots()
    height = 0.8 / len(runs)
    for i, (label, per_type) in enumerate(runs.items()):
        ax.barh(
            [y + i * height for y in range(len(types))],
            [per_type.get(t, 0) for t in types],
            height=height,
            label=label,
        )
    ax.set_yticks([y + height * (len(runs) - 1) / 2 for y in range(len(types))], types, fontsize=8)
    ax.set(xlabel="bytes per step (on the wire)", title="bytes sent per message type")
    _legend(ax, len(runs))
    return _png(fig)


@plot
def step_times(runs: dict[str, Records]) -> bytes:
    fig = _figure(figsize=(10, 3))
    ax = fig.subplots()
    for label, records in runs.items():
        steps = [r for r in records if r["kind"] == "step"]
        ax.plot([s["step"] for s in steps], [s["step_time_s"] * 1000 for s in steps], lw=1, label=label)
    ax.set(xlabel="step", ylabel="ms", title="step time")
    _legend(ax, len(runs))
    return _png(fig)


@plot
def run_times(sweeps: dict[str, tuple[list[str], Rows]]) -> bytes:
    """Wall time of each run of each sweep (its varied keys, its rows), the run named by its settings."""
    named = {
        label: ([setting_label(r, [*keys, "seed"]) for r in rows], rows)
        for label, (keys, rows) in sweeps.items()
    }
    longest = max(len(name) for names, _ in named.values() for name in names)
    fig = _figure(figsize=(10, 3 + 0.04 * longest))  # room for the names, rotated under the axis
    ax = fig.subplots()
    for label, (names, rows) in named.items():
        ax.plot(names, [r.get("wall_time_s") or 0 for r in rows], "o-", label=label)
    ax.set(ylabel="s", title="wall time per run (training, from summary.json)")
    for tick in ax.get_xticklabels():  # each name ends under its point
        tick.set(rotation=60, ha="right", rotation_mode="anchor", fontsize=7)
    _legend(ax, len(sweeps))
    return _png(fig)


@plot
def tradeoff(sweeps: dict[str, Rows], keys: list[str], utility: str, leakage: list[str]) -> bytes:
    """Utility against leakage, one panel per leakage column: the mean over seeds of each setting
    (bars: one standard deviation), one curve per setting of the other keys along the first key."""
    fig = _figure(figsize=(5 * len(leakage) + 3, 4))  # + the legend, right of the panels
    axes = fig.subplots(1, len(leakage), squeeze=False)[0]
    for ax, column in zip(axes, leakage, strict=True):
        for label, rows in sweeps.items():
            for curve, points in _curves(rows, keys, utility, column).items():
                xs = [p[1] for p in points]
                ys = [p[3] for p in points]
                ax.errorbar(
                    xs,
                    ys,
                    xerr=[p[2] for p in points],
                    yerr=[p[4] for p in points],
                    marker="o",
                    capsize=3,
                    label=" ".join(filter(None, [label if len(sweeps) > 1 else "", curve])) or label,
                )
                for value, x, _, y, _ in points:
                    ax.annotate(value, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set(xlabel=f"leakage: {column}", ylabel=f"utility: {utility}")
    _legend(axes[-1], len(axes[-1].get_legend_handles_labels()[0]))  # every panel has the same curves
    fig.suptitle(f"trade-off (labels: {keys[0] if keys else 'run'})", fontsize=9)
    return _png(fig)


def _curves(
    rows: Rows, keys: list[str], utility: str, leakage: str
) -> dict[str, list[tuple[str, float, float, float, float]]]:
    """{other keys' settings: [(first key's setting, `scale=0.1`, mean leakage, sd, mean utility, sd), ...]}."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if isinstance(row.get(leakage), int | float) and isinstance(row.get(utility), int | float):
            first = setting_label(row, keys[:1])
            rest = setting_label(row, keys[1:]) if keys[1:] else ""
            groups[(rest, first)].append(row)
    curves: dict[str, list[tuple[str, float, float, float, float]]] = defaultdict(list)
    for (rest, first), members in groups.items():  # insertion order: the sweep's order
        xs, ys = [m[leakage] for m in members], [m[utility] for m in members]
        curves[rest].append((first, statistics.fmean(xs), _sd(xs), statistics.fmean(ys), _sd(ys)))
    return curves


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


@plot
def roc_curves(curves: dict[str, tuple[list[float], list[float]]], title: str) -> bytes:
    """ROC curves (FPR, TPR), on linear and on log-log axes (the low-FPR regime), with the diagonal."""
    fig = _figure(figsize=(9, 3.8))
    linear, low = fig.subplots(1, 2)
    for label, (fpr, tpr) in curves.items():
        linear.plot(fpr, tpr, label=label)
        low.plot([max(f, 1e-4) for f in fpr], [max(t, 1e-4) for t in tpr], label=label)
    for ax in (linear, low):
        ax.plot([1e-4, 1], [1e-4, 1], color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel="false positive rate", ylabel="true positive rate")
    low.set(xscale="log", yscale="log", xlim=(1e-4, 1), ylim=(1e-4, 1))
    _legend(low, len(curves))
    fig.suptitle(title, fontsize=9)
    return _png(fig)


@plot
def along_axis(
    axis: str, values: list[str], series: dict[str, list[float | None]], utility: list[float | None]
) -> bytes:
    """Each attack's leakage metric along one axis of settings, and the main task's accuracy beside it."""
    fig = _figure(figsize=(10, 3.8))
    leak, main = fig.subplots(1, 2)
    xs = list(range(len(values)))
    for label, ys in series.items():
        leak.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
    main.plot(xs, [float("nan") if u is None else u for u in utility], marker="o", color="black")
    for ax, ylabel in ((leak, "attack metric (mean over seeds)"), (main, "main-task test accuracy")):
        ax.set(xlabel=axis, ylabel=ylabel, xticks=xs, xticklabels=values)
    _legend(leak, len(series))
    fig.suptitle(f"leakage along {axis}", fontsize=9)
    return _png(fig)


@plot
def defense_tradeoff(points: dict[str, list[tuple[str, float, float]]]) -> bytes:
    """Per attack, each defense setting as a point (attack metric, main-task accuracy), labelled by name."""
    cols = min(3, len(points))
    rows = -(-len(points) // cols)
    fig = _figure(figsize=(5 * cols, 3.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax in axes[len(points) :]:
        ax.set_visible(False)
    for ax, (attack, settings) in zip(axes, points.items(), strict=False):
        ax.plot([p[1] for p in settings], [p[2] for p in settings], marker="o", linestyle="")
        for name, x, y in settings:
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"leakage: {attack}", fontsize=8)
        ax.set_ylabel("main-task test accuracy")
    fig.suptitle("defenses: utility against leakage (one point per setting)", fontsize=9)
    return _png(fig)
