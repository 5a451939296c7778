"""Direct label inference (paper 004, Lemma 1) at a passive party, under `split` and `split-he`,
in one report: the same config, the same attack on the same party's wire, two protocols."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml

from vflnet.runner.local import run_local

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "label-leak.yaml"


def run(out_dir: Path, quick: bool = False, key_bits: int = 1024) -> str:
    base = yaml.safe_load(CONFIG.read_text())
    base["trace"] = {"parties": []}
    base["attacks"] = [{"name": "direct-label-inference", "party": "passive-1"}]
    cases: list[tuple[str, dict[str, Any]]] = []
    split = copy.deepcopy(base)
    split["train"].update(epochs=1, max_steps=10 if quick else 0)
    cases.append(("split", split))
    he = copy.deepcopy(base)
    he["protocol"] = {"kind": "split-he", "aggregation": "sum", "he": {"key_bits": key_bits}}
    he["train"].update(epochs=1, max_steps=5 if quick else 20)
    cases.append((f"split-he ({key_bits}-bit Paillier)", he))
    rows = []
    for label, data in cases:
        out_dir.mkdir(parents=True, exist_ok=True)
        name = label.split()[0]
        data["run"].update(dir=str(out_dir), id=f"label-leak-{name}")
        path = out_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        start = time.perf_counter()
        if run_local(path, run_dir=out_dir / name, progress=False) != 0:
            raise RuntimeError(f"{label} run failed; see {out_dir / name}/logs")
        score = json.loads((out_dir / name / "attacks/scores.json").read_text())[
            "direct-label-inference@passive-1"
        ]
        summary = json.loads((out_dir / name / "summary.json").read_text())
        rows.append(
            (label, score, summary["final"].get("test_accuracy", float("nan")), time.perf_counter() - start)
        )
    lines = [
        "| protocol | labels inferred by passive-1 | label accuracy | from plaintext gradients | chance | main-task test acc. | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, s, mta, seconds in rows:
        lines.append(
            f"| {label} | {s['samples']} | {s['label_accuracy']:.3f} | {s['informed_fraction']:.0%} | {s['chance']:.2f} | {mta:.3f} | {seconds:.0f} s |"
        )
    report = "\n".join(lines)
    (out_dir / "report.md").write_text(report + "\n")
    return report
