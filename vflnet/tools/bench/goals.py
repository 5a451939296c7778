"""`vflnet bench goals`: the performance figures against their goals, side by side, in one invocation.

It calls the other benchmarks' own measuring functions, one after another on the same machine, and
prints one table: a row per figure, its measured value, its goal, whether the goal is met, and the
machine's load average (1 min, before -> after the measurement the row comes from):

- start-up (`vflnet bench startup`): a coordinator's and a passive party's start to serving, cold and
  warm (goal: warm <= 0.5 s); the fork server's start; `make demo`'s run (configs/digits-2p.yaml),
  its wall and its overhead (wall - training; goal: warm <= 3 s); the dp-label-leak sweep's wall and
  overhead per run (goal: warm <= 2 s);
- step time under netem (`vflnet bench netem`): the median step of configs/digits-2p.yaml in the
  network lab at 0, 10 and 50 ms one-way (goal: 10 and 50 ms <= 2 x delay + the step at 0 ms + 3 ms).
  Needs root and network namespaces; elsewhere its rows say why;
- vflnet against its floor on the digits MLP (`vflnet bench transport`'s digits-mlp-b256 over gRPC,
  `vflnet bench grpc-floor`'s ``coordinated`` mode, vflnet's message pattern in bare Python gRPC),
  alternating, ``--repeat`` rounds (goal: vflnet <= floor + 1 ms per step, judged on the median of each
  round's back-to-back difference, which the row lists: best against best paired runs minutes apart
  and moved by +-1 ms between runs of this command on a shared machine). Like the floor's, vflnet's
  steps are one unbroken pipeline: its runs write their one checkpoint at the end (timed apart), so
  the pipeline runs on across epoch ends; and the trace tap on every
  party against the floor's bare crash-safe tap (``coordinated+tap``), each as the ms it adds per step,
  median of the rounds (goal: tap <= bare tap + 0.3 ms). Each tap is timed inside one run of its own:
  on for the steps of even blocks of 20, off for the odd blocks (vflnet's parties pass the odd blocks'
  messages on before building an event, as a party without a tap does), the median step of the tapped
  blocks minus the untapped blocks'. Runs with and without a tap, compared, moved by +-0.5 ms.

Two other goals (the MNIST CNN >= 1.0 of its reference, no regression in `vflnet bench
he-step`) take minutes each on two cores: their rows name the command that measures them.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vflnet import progress
from vflnet.tools.bench import grpc_floor, netem, startup, tap_ab, transport
from vflnet.tools.bench.common import Row, markdown_table, parse_args, scratch, write_json
from vflnet.tools.lab.netlab import tcp_cc_refusal, unavailable_reason

WARM_PARTY_S = 0.5
DEMO_OVERHEAD_S = 3.0
SWEEP_OVERHEAD_S = 2.0
FLOOR_MARGIN_MS = 1.0
TAP_MARGIN_MS = 0.3
LOAD_SAMPLE_S = 2.0
DIGITS = "digits-mlp-b256"
FLOOR_MODE = "coordinated"  # vflnet's message pattern: a unary RunStep per party per step, unary exchanges


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vflnet bench goals", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="party starts and demo runs; rounds of the floor/vflnet runs"
    )
    p.add_argument("--sweep-runs", type=int, default=0, help="the sweep's first N runs (0: all 8)")
    p.add_argument("--netem-epochs", type=int, default=2, help="epochs of configs/digits-2p.yaml per delay")
    p.add_argument("--wire-trips", type=int, default=20, help="round trips of netem's plain-TCP probe")
    p.add_argument("--tcp-cc", default="", metavar="NAME", help="the lab hosts' TCP congestion control")
    p.add_argument("--prefix", default="goals", help="the network lab's namespace prefix")
    p.add_argument("--floor-steps", type=int, default=1000, help="timed steps of each grpc-floor run")
    p.add_argument(
        "--transport-epochs", type=int, default=60, help="epochs of the digits-mlp-b256 runs (6 steps each)"
    )
    p.add_argument(
        "--skip",
        nargs="+",
        choices=["startup", "netem", "floor"],
        default=[],
        help="leave these out (their rows say so)",
    )
    return p


SMOKE = {
    "repeat": 1,
    "sweep_runs": 2,
    "netem_epochs": 1,
    "wire_trips": 5,
    "floor_steps": 30,
    "transport_epochs": 1,
}


def _load() -> float:
    return os.getloadavg()[0]


def _row(
    figure: str,
    measured: float | None,
    unit: str,
    load: str,
    limit: float | None = None,
    goal: str = "",
    note: str = "",
) -> Row:
    """One figure: ``measured`` (None: not measured, ``note`` says why) against ``limit`` (None: a figure
    shown beside the goals, not a goal itself)."""
    met = None if limit is None or measured is None else measured <= limit
    return {
        "figure": figure,
        "measured": None if measured is None else round(measured, 4),
        "unit": unit,
        "goal": goal or ("-" if limit is None else f"<= {limit:.3g} {unit}"),
        "limit": None if limit is None else round(limit, 4),
        "met": met,
        "load": load,
        "note": note,
    }


def _unmeasured(figures: list[tuple[str, str]], why: str, load: str = "-") -> list[Row]:
    return [_row(figure, None, unit, load, note=why) for figure, unit in figures]


def _timed(measure: Callable[[], Any]) -> tuple[Any, str]:
    """What ``measure`` returns, and the load average before -> after it, with the highest seen in
    between (sampled every few seconds: another job can come and go within one part)."""
    before, seen, done = _load(), [], threading.Event()

    def sample() -> None:
        while not done.wait(LOAD_SAMPLE_S):
            seen.append(_load())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = measure()
    finally:
        done.set()
        sampler.join()
    after = _load()
    return result, f"{before:.1f} -> {after:.1f}, peak {max([before, *seen, after]):.1f}"


# ------------------------------------------------------------------------------------------- start-up
STARTUP_FIGURES = [
    ("coordinator: start to serving, cold", "s"),
    ("coordinator: start to serving, warm", "s"),
    ("passive party: start to serving, cold", "s"),
    ("passive party: start to serving, warm", "s"),
    ("fork server: start to first child (once per run or sweep)", "s"),
    ("resident fork server: `vflnet warm start` (once per installation)", "s"),
    ("make demo's run: wall, cold", "s"),
    ("make demo's run: wall, warm", "s"),
    ("make demo's run: wall, resident", "s"),
    ("make demo's run: overhead (wall - training), cold", "s"),
    ("make demo's run: overhead (wall - training), warm", "s"),
    ("make demo's run: overhead (wall - training), resident", "s"),
    ("dp-label-leak sweep: wall per run, cold", "s"),
    ("dp-label-leak sweep: wall per run, warm", "s"),
    ("dp-label-leak sweep: wall per run, resident", "s"),
    ("dp-label-leak sweep: overhead per run, cold", "s"),
    ("dp-label-leak sweep: overhead per run, warm", "s"),
    ("dp-label-leak sweep: overhead per run, resident", "s"),
]


def startup_rows(args: argparse.Namespace) -> list[Row]:
    (rows, same), load = _timed(lambda: startup.measure(args.repeat, args.sweep_runs))

    def find(prefix: str) -> Row:
        return next(r for r in rows if str(r["what"]).startswith(prefix))

    def value(prefix: str, start: str) -> float:
        return float(find(prefix)[f"{start}_s"])  # type: ignore[arg-type]

    sweep_runs = str(find("sweep dp-label-leak")["what"]).split("(")[1].split(")")[0]  # "8 runs"
    sweep_note = f"{sweep_runs}, --jobs 1; results identical cold/warm/resident: {'yes' if same else 'NO'}"
    limits = {
        "coordinator": (WARM_PARTY_S, ""),
        "passive party": (WARM_PARTY_S, ""),
        "make demo's run: overhead": (DEMO_OVERHEAD_S, f"<= {DEMO_OVERHEAD_S:g} s (wall <= training + 3 s)"),
        "dp-label-leak sweep: overhead": (SWEEP_OVERHEAD_S, ""),
    }
    sources = {
        "coordinator": "coordinator: start to serving",
        "passive party": "passive party: start to serving",
        "fork server": "fork server",
        "resident fork server": "resident server",
        "make demo's run: wall": "run: command wall",
        "make demo's run: overhead": "run: overhead",
        "dp-label-leak sweep: wall": "sweep dp-label-leak",
        "dp-label-leak sweep: overhead": "sweep: overhead per run",
    }
    out: list[Row] = []
    for figure, unit in STARTUP_FIGURES:
        start = figure.rsplit(", ", 1)[1] if figure.endswith((", cold", ", resident")) else "warm"
        if figure.startswith("resident fork server"):
            start = "resident"
        key = next(k for k in sources if figure.startswith(k))
        limit, goal = limits.get(key, (None, "")) if start != "cold" else (None, "")
        note = sweep_note if key.startswith("dp-label-leak") else f"median of {args.repeat}"
        if key.endswith("fork server"):
            note = ""
        elif start == "resident":
            note += "; each command sent to a resident server (`vflnet warm start` before it)"
        out.append(_row(figure, value(sources[key], start), unit, load, limit, goal, note))
    return out


# ---------------------------------------------------------------------------------------------- netem
NETEM_DELAYS = (0.0, 10.0, 50.0)


def _netem_figure(delay: float) -> str:
    if delay == 0:
        return "netem 0 ms: median step (the compute)"
    return f"netem {delay:g} ms: median step"


def netem_rows(args: argparse.Namespace) -> list[Row]:
    figures = [(_netem_figure(d), "ms") for d in NETEM_DELAYS]
    why = unavailable_reason()
    if why is not None:
        return _unmeasured(figures, f"not measured: {why}")
    netem_args = netem.build_parser().parse_args(
        ["--delays", *map(str, NETEM_DELAYS), "--epochs", str(args.netem_epochs)]
        + ["--wire-trips", str(args.wire_trips), "--prefix", args.prefix]
        + (["--tcp-cc", args.tcp_cc] if args.tcp_cc else [])
    )
    rows = netem.measure_delays(netem_args)
    out = []
    for r in rows:
        delay = float(r["delay_ms"])  # type: ignore[arg-type]
        note = (
            f"{r['steps']} steps, p10-p90 {r['p10_ms']:.1f}-{r['p90_ms']:.1f} ms, wire {r['wire_ms']:.1f} ms, "
            f"tcp {r['tcp']}, {r['emulator']}"
        )
        limit = float(r["goal_ms"]) if delay and "goal_ms" in r else None  # type: ignore[arg-type]
        goal = f"2 x {delay:g} + compute + {netem.GOAL_MARGIN_MS:g} = {limit:.1f} ms" if limit else ""
        out.append(_row(_netem_figure(delay), float(r["step_ms"]), "ms", str(r["load"]), limit, goal, note))  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------- vflnet vs its floor
VFLNET_ROW = f"digits MLP b256: vflnet over gRPC ({DIGITS})"
FLOOR_ROW = f"digits MLP b256: the floor (grpc-floor {FLOOR_MODE})"
GAP_ROW = "digits MLP b256: vflnet - floor, median of the rounds"
REFERENCE_ROW = "digits MLP b256: in one process (grpc-floor reference)"
TAP_ROW = "trace tap on every party: vflnet, + per step (tapped - untapped blocks, median of the rounds)"
BARE_TAP_ROW = (
    f"bare crash-safe tap (grpc-floor {FLOOR_MODE}+tap), + per step (tapped - untapped blocks, median of "
    "the rounds)"
)
# The taps are timed inside one run each (an A/B): the tap is on for the steps of even blocks of
# TAP_BLOCKS steps and off for the odd ones, on the same processes. Separate runs with and without a
# tap differ by +-0.5 ms from run to run on a shared machine, more than the tap's own cost.
TAP_BLOCKS = tap_ab.BLOCKS  # vflnet's runs: the plug-in module tap_ab gates their chains
# steps left out at each end of a block, conservatively: up to 3 steps are in flight, so a block's last
# steps overlap the next block's
TAP_EDGE = 3
TAP_MIN_STEPS = 5 * TAP_BLOCKS  # block 0 (the run's first steps) is left out
DIGITS_STEPS_PER_EPOCH = 6  # 1,437 training rows of digits in batches of 256
FLOOR_FIGURES = [
    (VFLNET_ROW, "ms/step"),
    (FLOOR_ROW, "ms/step"),
    (GAP_ROW, "ms"),
    (REFERENCE_ROW, "ms/step"),
    (TAP_ROW, "ms"),
    (BARE_TAP_ROW, "ms"),
]


def _vflnet_run(name: str, epochs: int, plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    """``name`` run as one pipeline, as the floor's steps are: its checkpoint (and the step after it)
    only at the end, where `transport.distributed` times it apart; ``plugins`` added to its config.
    Its run folder, traces and all, is removed with the scratch folder."""
    case = copy.deepcopy(transport.CASES[name])
    case["train"].update(epochs=epochs, checkpoint_every=epochs)
    case["plugins"] = [*case.get("plugins", []), *plugins]
    with scratch("vflnet-bench-goals-") as tmp:
        case["run"]["dir"] = str(tmp)
        return transport.distributed(case, Path(tmp), "grpc")


def _vflnet_tap_ms(epochs: int) -> float:
    """The ms vflnet's trace tap adds per step, timed inside one run (TAP_BLOCKS)."""
    epochs = max(epochs, -(-TAP_MIN_STEPS // DIGITS_STEPS_PER_EPOCH))
    # the plug-in gates every party's chain (its traces hold the even blocks only: never kept)
    return tap_ms(_vflnet_run(DIGITS + transport.TAP, epochs, (tap_ab.__name__,))["step_times"])


def _floor_tap_ms(steps: int) -> float:
    """The ms the floor's bare tap adds per step, timed inside one run (TAP_BLOCKS)."""
    with scratch("vflnet-floor-") as tap_dir:
        return tap_ms(grpc_floor.tap_ab(max(steps, TAP_MIN_STEPS), FLOOR_MODE, str(tap_dir), TAP_BLOCKS))


def tap_ms(step_times: list[tuple[int, float]]) -> float:
    """The median step (ms) of the tapped blocks minus the untapped blocks' median, from the (step,
    seconds) of one A/B run. Left out: a block's first and last TAP_EDGE steps, and block 0 (a run's
    first steps, tapped, are slower: connections, allocations). The untapped half still calls the
    client hooks, which return at once (~5 us of CPU per step a party without a tap does not pay): the
    figure is low by about that much."""
    halves: tuple[list[float], list[float]] = ([], [])
    for step, seconds in step_times:
        if step >= TAP_BLOCKS and TAP_EDGE <= step % TAP_BLOCKS < TAP_BLOCKS - TAP_EDGE:
            halves[step // TAP_BLOCKS % 2].append(1000 * seconds)
    tapped, untapped = halves
    if not tapped or not untapped:
        raise ValueError(f"an A/B run needs steps in two blocks of {TAP_BLOCKS}; got {len(step_times)} steps")
    return statistics.median(tapped) - statistics.median(untapped)


def floor_rows(args: argparse.Namespace) -> list[Row]:
    """vflnet and the floor alternating, each without a tap and with its tap's A/B run, and the floor's
    one-process reference, ``--repeat`` rounds of each."""
    kinds: dict[str, Callable[[], float]] = {
        "floor": lambda: 1000 / grpc_floor.distributed(args.floor_steps, FLOOR_MODE),
        "vflnet": lambda: 1000 / _vflnet_run(DIGITS, args.transport_epochs)["steps_per_s"],
        "floor+tap": lambda: _floor_tap_ms(args.floor_steps),
        "vflnet+tap": lambda: _vflnet_tap_ms(args.transport_epochs),
        "reference": lambda: 1000 / grpc_floor.reference(args.floor_steps),
    }
    ms: dict[str, list[float]] = {kind: [] for kind in kinds}

    def alternate() -> None:
        for i in range(args.repeat):
            for kind, measure in kinds.items():
                ms[kind].append(measure())
                what = "ms per step" if "+tap" not in kind else "ms per step added"
                progress.note(f"  run {i + 1} of {args.repeat}, {kind}: {ms[kind][-1]:.2f} {what}")

    _, load = _timed(alternate)
    return floor_figures(ms, load, args.floor_steps)


def _rounds(values: list[float]) -> str:
    return ", ".join(f"{v:+.2f}" for v in values)


def floor_figures(ms: dict[str, list[float]], load: str, floor_steps: int) -> list[Row]:
    """The rows of ``ms`` (one per round and kind, the kinds of a round run back to back): ms per step,
    and for the ``+tap`` kinds the ms their tap adds per step (``tap_ms``). The floor goal is judged on
    each round's difference, median of the rounds: best against best would pair runs minutes apart,
    and on a shared machine either best can be a lucky run (the gap that comparison gave moved by +-1
    ms between runs of this command)."""
    best = {kind: min(ms[kind]) for kind in ("floor", "vflnet", "reference")}

    def per_round(a: str, b: str) -> list[float]:
        return [x - y for x, y in zip(ms[a], ms[b], strict=True)]

    gaps = per_round("vflnet", "floor")
    taps, bares = ms["vflnet+tap"], ms["floor+tap"]
    gap, tap, bare = statistics.median(gaps), statistics.median(taps), statistics.median(bares)
    rounds = f"{len(gaps)} rounds, alternating"
    tap_limit = bare + TAP_MARGIN_MS
    return [
        _row(VFLNET_ROW, best["vflnet"], "ms/step", load, note=f"best of {rounds} (3 steps in flight)"),
        _row(
            FLOOR_ROW,
            best["floor"],
            "ms/step",
            load,
            note=f"best of {rounds} (2 steps in flight), {floor_steps} timed steps",
        ),
        _row(
            GAP_ROW,
            gap,
            "ms",
            load,
            FLOOR_MARGIN_MS,
            f"vflnet <= floor + {FLOOR_MARGIN_MS:g} ms",
            f"each round's vflnet - floor, run back to back: {_rounds(gaps)} ms "
            f"(best against best: {best['vflnet'] - best['floor']:+.2f})",
        ),
        _row(
            REFERENCE_ROW,
            best["reference"],
            "ms/step",
            load,
            note=f"best of {rounds}; the machine's speed (docs/performance.md: 1.16 ms on 2026-11-24)",
        ),
        _row(
            TAP_ROW,
            tap,
            "ms",
            load,
            tap_limit,
            f"bare tap + {TAP_MARGIN_MS:g} = {tap_limit:.2f} ms",
            f"each round's {DIGITS}+tap run, tapped - untapped blocks of {TAP_BLOCKS} steps: {_rounds(taps)} ms"
            + ("; tapped blocks beat untapped ones: noise above the margin" if min(tap, bare) < 0 else ""),
        ),
        _row(
            BARE_TAP_ROW,
            bare,
            "ms",
            load,
            note=f"each round's floor+tap run, tapped - untapped blocks of {TAP_BLOCKS} steps: {_rounds(bares)} ms",
        ),
    ]


# ------------------------------------------------------------------------------------------- the rest
NOT_HERE = [
    _row(
        "MNIST CNN b128: vflnet / reference",
        None,
        "x",
        "-",
        goal=">= 1.0",
        note="not run by `bench goals` (minutes on 2 cores): `vflnet bench transport --case mnist-cnn-b128`",
    ),
    _row(
        "split-he step: no regression",
        None,
        "s/step",
        "-",
        goal="no regression",
        note="not run by `bench goals` (minutes on 2 cores): `vflnet bench he-step`",
    ),
]

SECTIONS: dict[str, tuple[Callable[[argparse.Namespace], list[Row]], list[tuple[str, str]]]] = {
    "startup": (startup_rows, STARTUP_FIGURES),
    "netem": (netem_rows, [(_netem_figure(d), "ms") for d in NETEM_DELAYS]),
    "floor": (floor_rows, FLOOR_FIGURES),
}


def _display(row: Row) -> Row:
    met = row["met"]
    measured = row["measured"]
    return {
        "figure": row["figure"],
        "measured": "-" if measured is None else f"{measured:.3g} {row['unit']}",
        "goal": row["goal"],
        "met": "-" if met is None else ("yes" if met else "no"),
        "load": row["load"],
        "note": row["note"] or "-",
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv, SMOKE)
    if args.transport_epochs < 1:  # refused now, not after minutes of other measurements
        parser.error(f"--transport-epochs: at least 1, got {args.transport_epochs}")
    refused = None if "netem" in args.skip else tcp_cc_refusal(args.tcp_cc)
    if refused:
        parser.error(f"--tcp-cc: {refused}")
    began, load_start = time.perf_counter(), _load()
    print(f"load average {load_start:.1f} at the start, {os.cpu_count()} cores", flush=True)
    rows: list[Row] = []
    failed, part_s = [], {}
    with progress.runs("bench goals", total=len(SECTIONS), unit="part"):
        for name, (measure, figures) in SECTIONS.items():
            part_began = time.perf_counter()
            if name in args.skip:
                rows += _unmeasured(figures, f"not measured: --skip {name}")
            else:
                try:
                    rows += measure(args)
                except Exception as exc:  # one part that fails must not hide the others' figures
                    failed.append(name)
                    rows += _unmeasured(figures, f"failed: {type(exc).__name__}: {exc}", f"{_load():.1f}")
            part_s[name] = round(time.perf_counter() - part_began, 1)
            progress.advance(name)
    rows += NOT_HERE
    seconds = time.perf_counter() - began
    load_end = _load()
    print()
    print(markdown_table([_display(r) for r in rows]))
    print(
        f"\n{os.cpu_count()} cores; load average (1 min) {load_start:.1f} at the start, {load_end:.1f} at the end; "
        f"{seconds:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in part_s.items())}). load: before -> after "
        "the measurement the row comes from, and the peak in between."
    )
    write_json(
        args.json,
        rows,
        cores=os.cpu_count(),
        load_average_start=load_start,
        load_average_end=load_end,
        seconds=seconds,
        part_seconds=part_s,
        smoke=args.smoke,
    )
    if failed:
        print(f"failed: {', '.join(failed)} (the rows say why)")
    return 1 if failed else 0
