"""`vflnet reproduce NAME --smoke` for every experiment and `vflnet bench --smoke`: each runs end to end
and writes its report (the paper's numbers beside ours, the dataset substitutes, the time), and the
shared pieces they are built from (`--smoke` defaults, the Markdown tables, the progress switch)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vflnet import progress
from vflnet.tools.bench import BENCHMARKS
from vflnet.tools.bench.common import markdown_table, parse_args
from vflnet.tools.bench.scaling import COLUMNS, read_proc, scaling_config
from vflnet.tools.reproduce.cli import EXPERIMENTS
from vflnet.validation import config_from_dict

SMOKE_TIMEOUT_S = 1100  # a hang guard on a loaded machine, not a speed target


def _vflnet(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VFLNET_QUIET": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vflnet", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )


def paper_columns(text: str) -> list[list[str]]:
    """For every Markdown table whose header has a column named paper...: that column's data cells."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and lines[i + 1].startswith("|---")):
            continue
        header = [c.strip().lower() for c in line.strip("|").split("|")]
        for col, name in enumerate(header):
            if "paper" in name:
                rows = []
                for row in lines[i + 2 :]:
                    if not row.startswith("|"):
                        break
                    rows.append([c.strip() for c in row.strip("|").split("|")][col])
                found.append(rows)
    return found


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_reproduce_smoke_writes_paper_numbers_substitute_and_time(name: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _vflnet(["reproduce", name, "--smoke", "--out-dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = (out / EXPERIMENTS[name].report).read_text()
    columns = paper_columns(text)
    assert columns, f"no table with a paper column in {name}'s report"
    assert any(re.search(r"\d", cell) for rows in columns for cell in rows), "no paper number beside ours"
    assert f"- Dataset substitute: {EXPERIMENTS[name].substitute}" in text
    assert "- Size: smoke" in text
    assert re.search(r"- Wall time: \d+ s", text)
    assert f"reproduce {name} --smoke" in text  # the exact command


# Figures that may be negative (a distributed run can beat an in-process reference slowed by other
# work); every other number of a row must be finite and >= 0.
# (goals: its "measured" column holds the ms a tap adds per step too, and "limit" that + 0.3 ms;
# tests/test_bench_goals.py checks that only the tap rows go below 0)
SIGNED = {"overhead_ms", "attack_adds_ms_per_step", "step_minus_wire_ms", "measured", "limit"}
# Per benchmark, figures that must be positive in every row.
POSITIVE = {
    "transport": ["grpc_steps_per_s", "loopback_steps_per_s", "reference_steps_per_s", "wire_bytes_per_step"],
    "paillier": ["engine_per_s", "phe_per_s"],
    "grpc-floor": ["steps_per_s", "ratio_to_reference"],
    "he-step": ["split_s_per_step", "split_he_s_per_step", "engine_s_per_step", "phe_s_per_step"],
    "feature-reconstruction": ["mitm_s", "brute_s"],
    "secureboost": ["seconds_per_tree", "bytes_per_tree"],
    "secureboost-anchors": [
        "seconds_per_tree"
    ],  # at the anchor's rows: none where noise hid the per-row cost
    "scaling": ["step_ms", "cpu_s", "peak_rss_mib", "bytes_per_step"],
    "cafe": ["attack_iteration_ms", "step_without_attack_ms"],
    "startup": [],  # a row has warm_s or resident_s, or both (below)
    "netem": ["step_ms"],
    "goals": [],  # a row may have no measured value, only the reason (tests/test_bench_goals.py)
    "psi": ["align_s", "common", "party_bytes_per_id", "peak_rss_mib"],
}


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_smoke_writes_every_benchmarks_figures(tmp_path: Path) -> None:
    assert POSITIVE.keys() == BENCHMARKS.keys()
    out = tmp_path / "bench"
    result = _vflnet(["bench", "--smoke", "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((out / "bench.json").read_text())
    assert record["smoke"] is True and record["benchmarks"].keys() == BENCHMARKS.keys()
    for name, bench in record["benchmarks"].items():
        # netem needs root and network namespaces; elsewhere it says why and has no rows
        assert "error" not in bench and bench["seconds"] > 0 and (bench["rows"] or bench.get("skipped")), name
        for row in bench["rows"]:
            numbers = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            assert all(math.isfinite(v) for v in numbers.values()), (name, row)
            assert all(v >= 0 for k, v in numbers.items() if k not in SIGNED), (name, row)
            assert all(row[key] > 0 for key in POSITIVE[name]), (name, row)
    for row in record["benchmarks"]["startup"]["rows"]:
        assert row.get("warm_s", 0) > 0 or row.get("resident_s", 0) > 0, row
    scaling = record["benchmarks"]["scaling"]["rows"]
    assert {(r["K"], r["role"].split()[0]) for r in scaling} == {
        (k, role) for k in (1, 2, 9) for role in ("coordinator", "active", "passive")
    }
    table = (out / "bench.md").read_text()
    assert all(f"## {name} (" in table for name in BENCHMARKS)


def test_smoke_sizes_replace_defaults_but_not_given_flags() -> None:
    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser()
        p.add_argument("--n", type=int, default=5000)
        p.add_argument("--dims", type=int, nargs="+", default=[10, 20, 30])
        return p

    smoke = {"n": 100, "dims": [10]}
    assert vars(parse_args(parser(), [], smoke)) == {
        "n": 5000,
        "dims": [10, 20, 30],
        "smoke": False,
        "json": None,
    }
    assert vars(parse_args(parser(), ["--smoke"], smoke)) == {
        "n": 100,
        "dims": [10],
        "smoke": True,
        "json": None,
    }
    args = parse_args(parser(), ["--smoke", "--n", "7", "--json", "x.json"], smoke)
    assert (args.n, args.dims, args.json) == (7, [10], Path("x.json"))


def test_markdown_table_has_every_column_of_every_row() -> None:
    table = markdown_table([{"a": 1, "b": 0.123456}, {"a": 2, "c": None, "b": float("nan")}])
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1 | 0.1235 | - |", "| 2 | nan | - |"]


def test_quiet_switch_turns_bars_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLNET_QUIET", "1")
    assert progress.quiet()
    progress.advance("no bar open: nothing happens")
    with progress.runs("outer", total=2) as outer, progress.runs("inner") as inner:
        progress.advance("inner run")
    assert outer.disable and inner.disable
    monkeypatch.setenv("VFLNET_QUIET", "0")
    assert not progress.quiet()


def test_scaling_reads_cpu_and_peak_memory_of_a_process() -> None:
    cpu, rss = read_proc(os.getpid())
    assert cpu > 0 and rss > 10  # this interpreter: some CPU spent, tens of MiB resident at least
    assert read_proc(2**22 + 1) is None  # above the kernel's pid limit: no such process


def test_scaling_configs_give_each_passive_party_a_block_of_columns() -> None:
    for k in (1, 2, 4, 8, 9, 32, COLUMNS):  # any K, not only those dividing 8
        cfg = config_from_dict(scaling_config(k, steps=3, batch=16))
        passive = [p for p in cfg.parties if p.role == "passive"]
        assert len(passive) == k and cfg.train.max_steps == 3
        spans = [tuple(map(int, str(p.features.columns).split(":"))) for p in passive]
        assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == COLUMNS
        assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1
    with pytest.raises(ValueError, match="columns"):
        scaling_config(COLUMNS + 1, steps=3, batch=16)
