"""`vflnet report` and `vflnet compare` over real (loopback, in-process) runs of a small sweep, and
the pages in a real headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config, write_config
from tests.headless import assert_not_blank, render
from vflnet.tools.experiments import capability, compare, report
from vflnet.tools.experiments.plan import load_sweep
from vflnet.tools.experiments.results import collect, write_table
from vflnet.tools.experiments.sweep import run_one, write_run_files

SCALE = "defenses[0].params.scale"


def tiny_sweep_file(tmp_path: Path, grid: dict[str, list[Any]], seeds: list[int]) -> Path:
    """Digits, one epoch over loopback; direct label inference against DP noise of two strengths."""
    base = base_config(aggregation="sum")
    base["transport"]["bridge"] = "loopback"
    base["attacks"] = [{"name": "direct-label-inference", "party": "passive-1"}]
    base["defenses"] = [{"name": "dp-gaussian", "party": "active", "params": {"scale": 0.01}}]
    write_config(tmp_path, base, "base.yaml")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "dp", "base": "base.yaml", "seeds": seeds, "grid": grid}))
    return path


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep's --out folder, its runs run here one by one (what each sweep worker process does)."""
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = load_sweep(tiny_sweep_file(tmp, {SCALE: [0.001, 2.0]}, [0]))
    out = tmp / "out"
    (out / "configs").mkdir(parents=True)
    for run in sweep.runs:
        config, meta = write_run_files(sweep, run, out / "configs")
        assert run_one(config, meta, out / "runs" / run.name) == 0
    write_table(collect(out / "runs"), out)
    return out


def run_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(d for d in (sweep_dir / "runs").iterdir() if d.is_dir())


def images(page: str) -> list[str]:
    return re.findall(r"<img [^>]*>", page)


def assert_self_contained(page: str) -> None:
    assert images(page) and all('src="data:image/png;base64,' in img for img in images(page))
    for external in ("<script", "<link", "href=", "url(", "http://", "https://", 'src="file'):
        assert external not in page


def test_a_run_report(sweep_dir: Path, tmp_path: Path) -> None:
    run = run_dirs(sweep_dir)[0]
    assert report.main([str(run), "--out", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert_self_contained(page)
    for section in ("Summary", "Run config", "Loss and accuracy", "Bytes on the wire", "Timing", "Attacks"):
        assert f"<h2>{section}</h2>" in page
    assert "passive-1/ExchangeEmbeddings" in page and "label_accuracy" in page and "dp-gaussian" in page
    assert "<details><summary>config.yaml (click to show)</summary><pre>" in page  # collapsed
    # curves, bytes, step times, and the attack's confusion matrix (a PNG it saved in attacks/)
    assert len(images(page)) == 4
    markdown = (tmp_path / "report.md").read_text()
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert len(linked) == 4 and all((tmp_path / link).stat().st_size > 0 for link in linked)
    assert "| passive-1/ExchangeEmbeddings |" in markdown


def test_a_sweep_report_has_the_table_and_the_trade_off(sweep_dir: Path, tmp_path: Path) -> None:
    assert report.main([str(sweep_dir), "--out", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert_self_contained(page)
    assert "Trade-off: utility vs leakage" in page and f"<th>{SCALE}</th>" in page
    for run in run_dirs(sweep_dir):
        assert f"<td>{run.name}</td>" in page
    markdown = (tmp_path / "report.md").read_text()
    # one seed: the seed column (and every other constant one) is listed once above the table
    assert f"| run | {SCALE} | " in markdown and "| seed |" not in markdown and "tradeoff.png" in markdown
    assert "The same in every run: seed = 0; " in markdown


def test_a_sweep_reports_curves_by_their_settings(sweep_dir: Path) -> None:
    assert set(report.named_records(report.load_sweep_dir(sweep_dir))) == {
        "scale=0.001, seed=0",
        "scale=2.0, seed=0",
    }


def test_compare_two_runs_and_two_sweeps(
    sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = run_dirs(sweep_dir)
    assert compare.main([str(a), str(b), "--out", str(tmp_path / "runs")]) == 0
    written = tmp_path / "runs"
    assert capsys.readouterr().out == f"wrote {written / 'compare.md'} and {written / 'compare.html'}\n"
    page = (tmp_path / "runs" / "compare.html").read_text()
    assert_self_contained(page)
    assert "Config keys that differ" in page and f"<td>{SCALE}</td>" in page
    assert f"<th>{a.name}</th><th>{b.name}</th>" in page
    assert compare.main([str(sweep_dir), str(sweep_dir), "--out", str(tmp_path / "sweeps")]) == 0
    assert "A: dp" in (tmp_path / "sweeps" / "compare.md").read_text()
    assert compare.main([str(a), str(sweep_dir), "--out", str(tmp_path / "mixed")]) == 2


def test_report_of_a_folder_with_no_runs(tmp_path: Path) -> None:
    assert report.main([str(tmp_path)]) == 2


@pytest.mark.slow  # Chromium's start takes over a minute on a loaded machine
def test_reports_render_in_headless_chromium(sweep_dir: Path, tmp_path: Path) -> None:
    assert report.main([str(run_dirs(sweep_dir)[0]), "--out", str(tmp_path / "run")]) == 0
    assert report.main([str(sweep_dir), "--out", str(tmp_path / "sweep")]) == 0
    # run report: summary, bytes, timing, attacks; sweep report: the results and capability score tables
    for page, n_tables in ((tmp_path / "run" / "report.html", 4), (tmp_path / "sweep" / "report.html", 2)):
        shown = render(page, tmp_path)
        decoded = shown.sizes("img", "data-natural")
        assert len(decoded) == len(images(page.read_text())) >= 4
        assert all(w > 100 and h > 100 for w, h in decoded), decoded  # every PNG decoded
        assert all(w > 100 and h > 100 for w, h in shown.sizes("img")), shown.sizes("img")  # and laid out
        tables = shown.sizes("table")
        assert len(tables) == n_tables and all(w > 0 and h > 0 for w, h in tables)
        assert_not_blank(shown.screenshot)


def test_defense_capability_score_follows_vflair_eq_1() -> None:
    assert capability.defense_capability_score(0.0, 1.0) == 1.0  # the ideal defense
    assert capability.defense_capability_score(1.0, 0.0) == pytest.approx(0.5)  # distance sqrt(0.5 + 0.5)
    assert capability.defense_capability_score(0.5, 0.5) == pytest.approx(2 / 3)
    assert capability.defense_capability_score(1.0, 1.0, beta=1.0) == 1.0  # beta 1: utility only
    with pytest.raises(ValueError, match="attack performance"):
        capability.defense_capability_score(1.5, 0.5)


def test_a_sweep_report_scores_each_setting_of_the_defense(sweep_dir: Path, tmp_path: Path) -> None:
    """The DCS table of the real sweep: one line per noise scale, from its runs' recorded rows."""
    rows = json.loads((sweep_dir / "results.json").read_text())
    attack = "attack.direct-label-inference@passive-1.label_accuracy"
    assert capability.attack_performance_columns(rows) == [attack]
    header, table = capability.score_table(rows, [SCALE], "test_accuracy")
    assert header == ["setting", "runs", "MP: test_accuracy", f"AP: {attack}", f"DCS: {attack}"]
    by_setting = {line[0]: line for line in table}
    assert set(by_setting) == {"scale=0.001", "scale=2.0"}
    for row in rows:
        _, _, mp, ap, dcs = by_setting[f"scale={row[SCALE]}"]
        assert (mp, ap) == (row["test_accuracy"], row[attack])
        assert dcs == capability.defense_capability_score(ap, mp)
    weak, strong = by_setting["scale=0.001"], by_setting["scale=2.0"]
    print("MP, AP, DCS", weak[2:], strong[2:])
    assert strong[3] < weak[3]  # more noise, fewer labels recovered
    assert report.main([str(sweep_dir), "--out", str(tmp_path)]) == 0
    markdown = (tmp_path / "report.md").read_text()
    assert "## Defense capability score" in markdown
    assert (
        f"| scale=2.0 | 1 | {report.fmt(strong[2])} | {report.fmt(strong[3])} | {report.fmt(strong[4])} |"
        in markdown
    )


@pytest.mark.slow  # Chromium's start takes over a minute on a loaded machine
def test_sweep_report_screenshot_shows_the_tables(sweep_dir: Path, tmp_path: Path) -> None:
    """The sweep report as Chromium draws it: a non-blank screenshot, and the page holds the results
    table and the defense capability score table, laid out."""
    assert report.main([str(sweep_dir), "--out", str(tmp_path / "sweep")]) == 0
    shown = render(tmp_path / "sweep" / "report.html", tmp_path)
    assert shown.screenshot.stat().st_size > 0
    assert_not_blank(shown.screenshot)
    assert "<h2>Results</h2>" in shown.dom and "<h2>Defense capability score</h2>" in shown.dom
    assert "<td>scale=2.0</td>" in shown.dom and f"<th>{SCALE}</th>" in shown.dom
    tables = shown.sizes("table")
    assert len(tables) == 2 and all(w > 0 and h > 0 for w, h in tables)
