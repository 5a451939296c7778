"""The `vflnet` command's surface: --version, every command registered with its help, usage lines that
show what the help mentions, `vflnet examples`, and a line saying what a command wrote."""

from __future__ import annotations

import argparse
import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO
from vflnet import cli
from vflnet.example_configs import EXAMPLES, example_files
from vflnet.tools.bench import BENCHMARKS
from vflnet.tools.experiments import sweep as sweep_cli
from vflnet.tools.experiments.plan import load_sweep

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"vflnet {PROJECT['project']['version']}\n"


def test_every_command_is_registered_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    top = cli.build_parser().format_help()
    for name, command in cli.COMMANDS.items():
        assert command.help and re.search(rf"^    {name}\b", top, re.M), name  # listed, with its help
        assert command.help in " ".join(top.split()), name
        parser = command.load().build_parser()
        assert parser.prog == f"vflnet {name}"
        assert parser.description and len(parser.description) > 20, name
        with pytest.raises(SystemExit) as done:
            cli.main([name, "--help"])
        assert done.value.code == 0, name
        assert capsys.readouterr().out.startswith(f"usage: vflnet {name} "), name
    for name, parser in _subparsers(cli.COMMANDS["config"].load().build_parser()).items():
        assert parser.description, f"config {name}"


def test_bench_help_says_what_each_benchmark_measures() -> None:
    text = cli.COMMANDS["bench"].load().build_parser().format_help()
    for name, (_, measures) in BENCHMARKS.items():
        assert f"  {name} " in text and measures in " ".join(text.split()), name


def test_sweep_usage_shows_collect_as_its_help_does() -> None:
    parser = sweep_cli.build_parser()
    assert "vflnet sweep collect DIR" in parser.description
    assert "vflnet sweep collect [-h] --out OUT dir" in parser.format_usage()


def test_examples_are_package_data() -> None:
    patterns = PROJECT["tool"]["setuptools"]["package-data"]["vflnet"]
    files = example_files()
    assert Path("digits-2p.yaml") in files and Path("sweeps/dp-label-leak.yaml") in files
    for f in files:  # a file the patterns miss would be left out of the wheel
        assert any(fnmatch.fnmatch(f"examples/{f}", p) for p in patterns), f
    assert (REPO / "configs").resolve() == EXAMPLES  # the repository's configs/ is the same folder


def test_examples_copies_every_file_and_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["examples"]) == 0
    dest = Path("vflnet-examples")
    assert capsys.readouterr().out.startswith(f"wrote {len(example_files())} example files to {dest}: ")
    for f in example_files():
        assert (dest / f).read_bytes() == (EXAMPLES / f).read_bytes()
    assert len(load_sweep(dest / "sweeps" / "dp-label-leak.yaml").runs) == 8  # its relative base resolves

    mine = dest / "digits-2p.yaml"
    mine.write_text("# my edits\n")
    (dest / "label-leak.yaml").unlink()
    assert cli.main(["examples", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vflnet examples: not overwriting ") and err.endswith("; nothing copied\n")
    assert str(mine) in err and str(dest / "label-leak.yaml") not in err
    assert mine.read_text() == "# my edits\n" and not (dest / "label-leak.yaml").exists()


def test_sweep_emit_and_collect_say_what_they_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k8s"
    sweep_file = str(REPO / "configs" / "sweeps" / "dp-label-leak.yaml")
    assert sweep_cli.main([sweep_file, "--emit", "k8s", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out / 'jobs.yaml'} (8 Jobs) and {out / 'sweep.json'}\n"
    assert (out / "jobs.yaml").exists() and (out / "sweep.json").exists()
    (tmp_path / "volume").mkdir()
    table = tmp_path / "table"
    assert sweep_cli.main(["collect", str(tmp_path / "volume"), "--out", str(table)]) == 0
    assert capsys.readouterr().out == f"wrote {table / 'results.csv'} and {table / 'results.json'} (0 runs)\n"
