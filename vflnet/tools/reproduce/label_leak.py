"""Direct label inference (paper 004, Lemma 1) at a passive party, under `split` and `split-he`,
in one report: the same config, the same attack on the same party's wire, two protocols."""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml

from vflnet import progress
from vflnet.example_configs import EXAMPLES
from vflnet.runner.local import run_local
from vflnet.tools.reproduce import add_size_flags

CONFIG = EXAMPLES / "label-leak.yaml"


# Lemma 1: from a plaintext gradient dl/dH_i the label is read off exactly (softmax + cross-entropy);
# under the paper's Algorithm 1 (split-he) the passive party sees no plaintext gradient (no number printed).
PAPER = {"split": "1.000 (Lemma 1: exact)", "split-he": "- (Alg. 1: gradients encrypted)"}


def run(out_dir: Path, quick: bool = False, smoke: bool = False, key_bits: int = 1024) -> str:
    """split for 10 steps (quick) or a whole epoch, split-he for 5 (quick) or 20 steps; smoke: 3 and 2
    steps, a 512-bit key, every role in this process (loopback bridge: no process start-up)."""
    base = yaml.safe_load(CONFIG.read_text())
    if smoke:
        key_bits = 512
        base.setdefault("transport", {})["bridge"] = "loopback"
    base["trace"] = {"parties": []}
    base["attacks"] = [{"name": "direct-label-inference", "party": "passive-1"}]
    cases: list[tuple[str, dict[str, Any]]] = []
    split = copy.deepcopy(base)
    split["train"].update(epochs=1, max_steps=3 if smoke else 10 if quick else 0)
    cases.append(("split", split))
    he = copy.deepcopy(base)
    he["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": key_bits, "allow_insecure_keys": key_bits < 1024},
    }
    he["train"].update(epochs=1, max_steps=2 if smoke else 5 if quick else 20)
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
        progress.advance(label)
    lines = [
        "| protocol | labels inferred by passive-1 | label accuracy | paper | from plaintext gradients | chance | main-task test acc. | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s, mta, seconds in rows:
        lines.append(
            f"| {label} | {s['samples']} | {s['label_accuracy']:.3f} | {PAPER[label.split()[0]]} | {s['informed_fraction']:.0%} "
            f"| {s['chance']:.2f} | {mta:.3f} | {seconds:.0f} s |"
        )
    report = "\n".join(lines)
    (out_dir / "report.md").write_text(report + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet reproduce label-leak", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("runs/reproduce-label-leak"))
    add_size_flags(
        parser,
        quick="10 split steps, 5 split-he steps",
        smoke="3 split steps, 2 split-he steps at 512 bits, loopback bridge",
    )
    args = parser.parse_args(argv)
    report = run(args.out_dir, quick=args.quick, smoke=args.smoke)
    print(report)
    print(f"\nreport written to {args.out_dir / 'report.md'}")
    return 0
