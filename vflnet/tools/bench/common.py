"""What every `vflnet bench` benchmark shares: `--smoke` (tiny sizes, seconds) and `--json` (its figures
as rows, which `vflnet bench all` gathers into one JSON and one Markdown table per benchmark); the
scratch folder of its runs, and how it runs a local cluster."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vflnet import progress
from vflnet.runner.interrupt import INTERRUPTED_EXIT

Row = dict[str, str | int | float | bool | None]


def parse_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, smoke: dict[str, Any]
) -> argparse.Namespace:
    """Add --smoke and --json to `parser` and parse `argv`. --smoke puts the `smoke` values in place of
    the defaults: an option given with another value on the command line keeps it."""
    sizes = ", ".join(f"--{k.replace('_', '-')} {_flag_value(v)}" for k, v in smoke.items())
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, seconds: {sizes}")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here, as rows (JSON)")
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in smoke.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    return args


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary folder for a benchmark's runs, removed when the block ends, except when an error
    ends it: then it is kept, and said so, because the error names files in it (a failed run's logs).
    So a path a benchmark prints exists after the command, or is said to be removed (`run_cluster`)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    except Exception:
        progress.note(f"kept {folder}: the files of the failed benchmark")
        raise
    except BaseException:  # Ctrl-C, SIGTERM: nothing to look at
        shutil.rmtree(folder, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)


class RunFailed(RuntimeError):
    """A benchmark's run failed; the message holds its launcher's lines."""


def run_cluster(config: Path, run_dir: Path, *, shown: bool = False) -> None:
    """`vflnet run` of ``config`` into ``run_dir``, for a benchmark: the launcher's lines (its banner,
    its summary table) are kept back and shown only if the run fails, as RunFailed's message, unless
    ``shown``: then they are followed by a line saying the run directory they name is removed (it is a
    `scratch` folder's); a run stopped by Ctrl-C or SIGTERM stops the benchmark (KeyboardInterrupt;
    `vflnet bench` says so)."""
    from vflnet.runner.local import run_local  # imports torch

    lines = io.StringIO()
    with contextlib.ExitStack() as kept_back:
        if not shown:
            kept_back.enter_context(contextlib.redirect_stdout(lines))
            kept_back.enter_context(contextlib.redirect_stderr(lines))
        rc = run_local(config, run_dir=run_dir, progress=False)
    if rc == INTERRUPTED_EXIT:  # the launcher stopped the run's processes
        raise KeyboardInterrupt
    if rc != 0:
        raise RunFailed(f"run {run_dir} failed (exit code {rc}):\n{lines.getvalue()}")
    if shown:
        print(f"(run directory {run_dir}: a benchmark's scratch, removed after its measurement)", flush=True)


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def write_json(path: Path | None, rows: list[Row], **extra: Any) -> None:
    """The benchmark's figures: one row per measured setting, plus any notes (`extra`)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, **extra}, indent=2) + "\n")


def markdown_table(rows: list[Row]) -> str:
    """The rows as a Markdown table, columns in first-seen order; floats to 4 significant digits."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)
