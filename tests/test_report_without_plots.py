"""`vflnet report` and `vflnet compare` without matplotlib (no plots extra): the tables are written
(Markdown and HTML), and the figures are left out with one line saying which extra draws them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import base_config, write_config
from vflnet.runner.local import run_local

pytestmark = pytest.mark.e2e

# the command as the `vflnet` script runs it, in an interpreter where matplotlib cannot be imported
NO_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; from vflnet.cli import main; sys.exit(main(sys.argv[1:]))"
)
EXTRA = "pip install 'vflnet[plots]'"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    data = base_config()
    data["transport"]["bridge"] = "loopback"  # one process: the run is not what is tested
    assert run_local(write_config(tmp, data), run_dir=tmp / "run", progress=False) == 0
    return tmp / "run"


@pytest.mark.parametrize("command", ["report", "compare"])
def test_without_matplotlib_the_tables_are_written_and_the_extra_named_once(
    run_dir: Path, tmp_path: Path, command: str
) -> None:
    dirs = [str(run_dir)] * (2 if command == "compare" else 1)
    done = subprocess.run(
        [sys.executable, "-c", NO_MATPLOTLIB, command, *dirs, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count(EXTRA) == 1, done.stderr
    md, page = ((tmp_path / "out" / f"{command}.{ext}").read_text() for ext in ("md", "html"))
    for text in (md, page.replace("&#x27;", "'")):
        assert text.count(EXTRA) == 1  # said once, at the top
    assert "|---|" in md and "bytes per step" in md  # the tables
    assert "<table>" in page and "<img" not in page
    assert not list((tmp_path / "out").rglob("*.png"))
