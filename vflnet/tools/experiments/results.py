"""One results table across a sweep's runs, read back from their run directories.

A sweep run's directory holds, next to what `vflnet run` writes, ``sweep-run.json`` (its name, seed
and the grid/zip values it ran with). The table has one row per completed run: the run, the varied
keys, the seed, the final metrics of ``summary.json``, the total bytes on the wire and every attack
score of ``attacks/scores.json``. A local sweep and `vflnet sweep collect` over a Kubernetes results
volume build it with the same code from the same files, so they give the same table.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

RUN_META = "sweep-run.json"
PARTIAL = ".partial"  # suffix of a run directory until its run completed (vflnet.tools.experiments.sweep)
# the final epoch record's fields that are bookkeeping, not results
_NOT_METRICS = ("kind", "epoch", "time_s")


def write_atomic(path: Path, text: str) -> None:
    """Readers (a resumed sweep, collect) see the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def is_completed(run_dir: Path) -> bool:
    """A run counts as done when its summary.json says so (the coordinator writes it atomically)."""
    try:
        return read_json(run_dir / "summary.json").get("status") == "completed"
    except (OSError, ValueError):
        return False


def complete(partial: Path, dest: Path) -> None:
    """Move a completed run from ``partial`` to ``dest``, making every path its JSON files name inside
    ``partial`` (summary.json's checkpoints, processes.json's logs, ...) name ``dest`` first: they were
    written while the run ran there. The rename is the commit: ``dest`` appears complete or not at all.
    Its logs keep the paths they were written with (what happened, where)."""
    moved = re.compile("|".join(re.escape(str(p)) + r"(?=$|[/\s'\"])" for p in {partial, partial.resolve()}))
    final = {str(partial): str(dest), str(partial.resolve()): str(dest.resolve())}

    def rewrite(value: Any) -> Any:
        if isinstance(value, str):
            return moved.sub(lambda m: final[m.group(0)], value)
        if isinstance(value, list):
            return [rewrite(v) for v in value]
        if isinstance(value, dict):
            return {k: rewrite(v) for k, v in value.items()}
        return value

    for path in sorted(partial.rglob("*.json")):
        data = read_json(path)
        if (new := rewrite(data)) != data:
            write_atomic(path, json.dumps(new, indent=2))
    partial.rename(dest)


def result_row(run_dir: Path) -> dict[str, Any]:
    meta = read_json(run_dir / RUN_META)
    summary = read_json(run_dir / "summary.json")
    row: dict[str, Any] = {"run": meta["run"], **meta["params"], "seed": meta["seed"]}
    final = summary.get("final") or {}
    row.update({k: v for k, v in final.items() if k not in _NOT_METRICS})
    row["bytes_sent"] = sum(summary.get("bytes_sent", {}).values())
    row["wall_time_s"] = summary.get("wall_time_s")
    scores = run_dir / "attacks" / "scores.json"
    if scores.exists():
        for attack, metrics in read_json(scores).items():
            row.update({f"attack.{attack}.{k}": v for k, v in metrics.items()})
    return row


def sweep_run_dirs(runs_dir: Path) -> list[Path]:
    """The completed sweep runs under ``runs_dir``, by name (a name starts with the run's index);
    a ``.partial`` directory is a run still going or cut off, even if its files look complete."""
    return sorted(
        d
        for d in runs_dir.iterdir()
        if d.is_dir() and not d.name.endswith(PARTIAL) and (d / RUN_META).exists() and is_completed(d)
    )


def collect(runs_dir: Path, names: set[str] | None = None) -> list[dict[str, Any]]:
    """Rows of the completed runs under ``runs_dir`` (only those in ``names`` when given)."""
    return [result_row(d) for d in sweep_run_dirs(runs_dir) if names is None or d.name in names]


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every key of every row, in first-seen order (runs may differ in their attacks)."""
    return list(dict.fromkeys(k for row in rows for k in row))


def setting_label(row: dict[str, Any], keys: list[str]) -> str:
    """A run's varied settings as ``name=value`` pairs, each key by its last dotted part when that is
    unambiguous (``defenses[0].params.scale`` -> ``scale=0.1``); the run's name when nothing varies."""
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    unique = len(set(short.values())) == len(short)
    return ", ".join(f"{short[k] if unique else k}={row.get(k)}" for k in keys) or str(row["run"])


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def write_table(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    """``results.csv`` and ``results.json`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    names = columns(rows)
    writer.writerow(names)
    for row in rows:
        writer.writerow([_cell(row.get(k)) for k in names])
    csv_path, json_path = out_dir / "results.csv", out_dir / "results.json"
    write_atomic(csv_path, buf.getvalue())
    write_atomic(json_path, json.dumps(rows, indent=2))
    return csv_path, json_path
