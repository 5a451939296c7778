"""`vflnet bench goals --smoke`: one run writes every goal's row, each with a measured value or the
reason it has none, and prints them as one table."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vflnet.tools.bench import BENCHMARKS, goals

SMOKE_TIMEOUT_S = 1100  # a hang guard on a loaded machine, not a speed target
# the ms a tap adds per step: under load a tapped run can come out faster than the untapped one
SIGNED = {goals.TAP_ROW, goals.BARE_TAP_ROW, goals.GAP_ROW}
# rows that are goals (a limit once measured), not figures shown beside them
GOAL_ROWS = [
    "coordinator: start to serving, warm",
    "passive party: start to serving, warm",
    "make demo's run: overhead (wall - training), warm",
    "make demo's run: overhead (wall - training), resident",
    "dp-label-leak sweep: overhead per run, warm",
    "dp-label-leak sweep: overhead per run, resident",
    "netem 10 ms: median step",
    "netem 50 ms: median step",
    goals.GAP_ROW,
    goals.TAP_ROW,
]


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_goals_smoke_writes_every_row_measured_or_why(tmp_path: Path) -> None:
    assert BENCHMARKS["goals"][0] == "vflnet.tools.bench.goals"
    out = tmp_path / "goals.json"
    result = subprocess.run(
        # a prefix of its own: `vflnet bench --smoke` may bring up its own labs beside this test
        [
            sys.executable,
            "-m",
            "vflnet",
            "bench",
            "goals",
            "--smoke",
            "--json",
            str(out),
            "--prefix",
            "goals-test",
        ],
        cwd=tmp_path,
        env={**os.environ, "VFLNET_QUIET": "1"},
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["smoke"] is True and record["cores"] == os.cpu_count()
    rows = record["rows"]
    expected = [figure for _, figures in goals.SECTIONS.values() for figure, _ in figures]
    assert [r["figure"] for r in rows] == expected + [r["figure"] for r in goals.NOT_HERE]
    for row in rows:
        measured = row["measured"]
        if measured is None:  # not measured: the row says why, and claims nothing
            assert row["note"].startswith(("not measured: ", "not run by ")) and row["met"] is None, row
            continue
        assert math.isfinite(measured) and (measured >= 0 or row["figure"] in SIGNED), row
        assert row["load"] != "-", row
        if row["figure"] in GOAL_ROWS:
            assert math.isfinite(row["limit"]) and row["met"] == (measured <= row["limit"]), row
        else:
            assert row["limit"] is None and row["met"] is None, row
    # this machine can measure everything but the netem rows (root and network namespaces)
    assert all(
        r["measured"] is not None for r in rows if r["figure"] in expected and "netem" not in r["figure"]
    )
    assert "| figure | measured | goal | met | load | note |" in result.stdout


def test_no_digits_epochs_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        goals.main(["--transport-epochs", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr()
    assert "--transport-epochs: at least 1, got 0" in err.err and "load average" not in err.out


def test_a_congestion_control_the_lab_cannot_use_is_refused_before_anything_runs(capsys):
    """Refused at once, not after the start-up part's minutes, when the netem part is to run."""
    with pytest.raises(SystemExit) as exit_:
        goals.main(["--tcp-cc", "no-such-cc"])
    assert exit_.value.code == 2
    err = capsys.readouterr()
    assert "--tcp-cc: TCP congestion control 'no-such-cc' cannot be set" in err.err
    assert "load average" not in err.out


def test_the_floor_goals_are_judged_on_each_rounds_difference_not_on_two_lucky_bests():
    """Best against best paired runs minutes apart: one lucky floor or vflnet run could say the goal
    was met (this session's runs of the command gave +0.13 to +2.39 ms for one code). The goal rows
    now take the median of each round's back-to-back differences, and list them; the taps come as
    the ms each adds per step, from the A/B inside its own run (``tap_ms``)."""
    ms = {  # ms per step, three rounds; vflnet's second run and the floor's first were lucky
        "floor": [5.0, 6.0, 6.0],
        "vflnet": [7.6, 5.9, 7.5],
        "floor+tap": [0.5, 0.4, 0.5],
        "vflnet+tap": [1.0, 0.8, 1.0],
        "reference": [1.5, 1.4, 1.6],
    }
    rows = {r["figure"]: r for r in goals.floor_figures(ms, "1.0 -> 1.0", 100)}
    assert [f for f, _ in goals.FLOOR_FIGURES] == list(rows)
    assert rows[goals.VFLNET_ROW]["measured"] == pytest.approx(5.9) and rows[goals.VFLNET_ROW]["met"] is None
    gap = rows[goals.GAP_ROW]
    assert gap["measured"] == pytest.approx(1.5)  # rounds: +2.6, -0.1, +1.5; best against best: +0.9
    assert gap["limit"] == goals.FLOOR_MARGIN_MS and gap["met"] is False
    assert "+2.60, -0.10, +1.50" in gap["note"] and "best against best: +0.90" in gap["note"]
    tap, bare = rows[goals.TAP_ROW], rows[goals.BARE_TAP_ROW]
    assert bare["measured"] == pytest.approx(0.5) and "+0.50, +0.40, +0.50" in bare["note"]
    assert tap["measured"] == pytest.approx(1.0) and "+1.00, +0.80, +1.00" in tap["note"]
    assert tap["limit"] == pytest.approx(0.5 + goals.TAP_MARGIN_MS) and tap["met"] is False


def test_the_tap_is_the_tapped_blocks_median_less_the_untapped_and_block_edges_are_left_out():
    """Up to three steps are in flight: a block's first and last steps overlap the next block's, so
    they count in neither half; nor does block 0, a run's first steps (connections, allocations)."""
    blocks, edge = goals.TAP_BLOCKS, goals.TAP_EDGE
    times = []
    for step in range(5 * blocks):
        tapped = step // blocks % 2 == 0
        if step < blocks:  # slow first steps (always tapped): counted, they would lift the tapped median
            ms = 9.0
        elif (
            not edge <= step % blocks < blocks - edge
        ):  # edges, uneven: counted, the difference goes negative
            ms = 3.0 if tapped else 9.0
        else:
            ms = (5.5 if tapped else 5.0) + (step % blocks - edge) * 0.1  # a spread, as real steps have
        times.append((step, ms / 1000))
    assert goals.tap_ms(times) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs steps in two blocks"):
        goals.tap_ms([(step, 0.005) for step in range(2 * blocks)])  # block 0 does not count
