"""The end-of-run summary table, read back from the run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} GiB"


def summary_rows(run_dir: Path) -> list[tuple[str, str]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_metrics(run_dir)
    steps = [r for r in records if r["kind"] == "step"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    rows = [("run", summary["run_id"]), ("status", summary["status"])]
    if summary.get("error"):
        rows.append(("error", summary["error"]))
    if epochs:
        last = epochs[-1]
        rows += [
            ("epochs", str(len(epochs))),
            ("training steps", str(summary.get("steps", len(steps)))),
            ("final train loss", f"{last['train_loss']:.4f}"),
            ("final train accuracy", f"{last['train_accuracy']:.4f}"),
        ]
        tested = [e for e in epochs if "test_accuracy" in e]
        if tested:
            rows += [
                ("test loss", f"{tested[-1]['test_loss']:.4f}"),
                ("test accuracy", f"{tested[-1]['test_accuracy']:.4f}"),
            ]
    if steps:
        mean_time = sum(s["step_time_s"] for s in steps) / len(steps)
        rows.append(("mean step time", f"{mean_time * 1000:.1f} ms ({1 / mean_time:.1f} steps/s)"))
        n = len(steps)
        for key, total in sorted(summary.get("bytes_sent", {}).items()):
            payload = summary.get("payload_bytes", {}).get(key, 0)
            rows.append(
                (f"bytes/step {key}", f"{_fmt_bytes(total / n)} (tensor payload {_fmt_bytes(payload / n)})")
            )
    scores_path = run_dir / "attacks" / "scores.json"
    if scores_path.exists():
        for attack, metrics in json.loads(scores_path.read_text()).items():
            text = ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()
            )
            rows.append(
                (f"attack {attack}", text or f"output in attacks/{attack}.npz (no ground-truth score)")
            )
    rows += effects_rows(summary.get("effects") or {})
    if summary.get("decryptions"):
        total = sum(summary["decryptions"]["values"].values())
        rows.append(
            (
                "coordinator decrypted",
                f"{total} masked values in {sum(summary['decryptions']['requests'].values())} requests",
            )
        )
    rows.append(("wall time", f"{summary.get('wall_time_s', 0):.1f} s"))
    rows.append(("run directory", str(run_dir)))
    return rows


# the host's counts of each attack (vflnet/threat/effects.py), as the table words them
_COUNT_WORDS = {
    "tapped": "tapped",
    "rewritten": "rewrote",
    "own_views": "own steps",
    "prediction_views": "prediction steps",
    "own_rows": "own rows changed",
    "samples": "samples in output",
}


def effects_rows(effects: dict[str, Any]) -> list[tuple[str, str]]:
    """What every attack, defense and hook point did (summary.json's ``effects``); zero counts of what
    an entry does not do are left out."""
    rows = []
    for key, counts in effects.get("attacks", {}).items():
        text = ", ".join(f"{w} {counts[k]}" for k, w in _COUNT_WORDS.items() if counts.get(k))
        rows.append((f"acted {key}", text or "nothing"))
    for key, d in effects.get("defenses", {}).items():
        rows.append((f"acted {key}", f"{d['acted']} times at hook {d['hook']}"))
    for key, h in effects.get("hooks", {}).items():
        if h["defenses"]:  # a hook point with no defense of the party's applies nothing
            rows.append((f"hook {key}", f"{h['defenses']} defense(s), applied {h['applied']} times"))
    for key, why in effects.get("never_acted", {}).items():
        rows.append((f"never acted {key}", why))
    return rows


def print_summary(run_dir: Path, stream: Any = None) -> None:
    stream = stream or sys.stdout
    rows = summary_rows(run_dir)
    width = max(len(k) for k, _ in rows)
    print("\n" + "-" * (width + 40), file=stream)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}", file=stream)
    print("-" * (width + 40), file=stream)
