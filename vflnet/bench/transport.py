"""`vflnet bench transport`: the distributed run next to the in-process reference, in one invocation.

For each case it trains the same model twice, as a local cluster of real processes over gRPC and in
one process with no transport, and prints steps/s of each, their ratio, and bytes on the wire per
step against the raw tensor bytes those messages carry.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from vflnet.runner.local import run_local
from vflnet.runner.reference import train_reference
from vflnet.validation import config_from_dict

DIGITS_MLP: dict[str, Any] = {
    "run": {"id": "bench-digits-mlp", "seed": 0},
    "protocol": {"kind": "split", "aggregation": "concat"},
    "data": {"dataset": "digits"},
    "parties": [
        {"name": "coordinator", "role": "coordinator"},
        {"name": "active", "role": "active"},
        {
            "name": "passive-1",
            "role": "passive",
            "features": {"region": [0, 8, 0, 4]},
            "bottom": {"kind": "mlp", "hidden": [64], "out": 32},
        },
        {
            "name": "passive-2",
            "role": "passive",
            "features": {"region": [0, 8, 4, 8]},
            "bottom": {"kind": "mlp", "hidden": [64], "out": 32},
        },
    ],
    "model": {"top": {"kind": "mlp", "hidden": [64]}},
    "train": {"epochs": 6, "batch_size": 256, "optimizer": {"kind": "adam", "lr": 0.003}, "eval_every": 100},
}

MNIST_CNN: dict[str, Any] = {
    "run": {"id": "bench-mnist-cnn", "seed": 0},
    "protocol": {"kind": "split", "aggregation": "concat"},
    "data": {"dataset": "mnist"},
    "parties": [
        {"name": "coordinator", "role": "coordinator"},
        {"name": "active", "role": "active"},
        {
            "name": "passive-1",
            "role": "passive",
            "features": {"region": [0, 28, 0, 14]},
            "bottom": {"kind": "cnn", "channels": [16, 32], "out": 64},
        },
        {
            "name": "passive-2",
            "role": "passive",
            "features": {"region": [0, 28, 14, 28]},
            "bottom": {"kind": "cnn", "channels": [16, 32], "out": 64},
        },
    ],
    "model": {"top": {"kind": "mlp", "hidden": [128]}},
    "train": {"epochs": 1, "batch_size": 128, "optimizer": {"kind": "adam", "lr": 0.001}, "eval_every": 100},
}

# The same digits run with every party's wire recorded by a trace tap: the cost of a tap per step.
DIGITS_MLP_TAPPED: dict[str, Any] = {**copy.deepcopy(DIGITS_MLP), "trace": {"parties": ["all"]}}

CASES = {"digits-mlp-b256": DIGITS_MLP, "digits-mlp-b256+tap": DIGITS_MLP_TAPPED, "mnist-cnn-b128": MNIST_CNN}


def _distributed(case: dict[str, Any], workdir: Path) -> dict[str, float]:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(case))
    run_dir = workdir / "run"
    if run_local(path, run_dir=run_dir, progress=False) != 0:
        raise RuntimeError(f"distributed run failed; see {run_dir}/logs")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "step"]
    warm = steps[2:] if len(steps) > 4 else steps  # first steps include connection set-up
    times = [s["step_time_s"] for s in warm]
    wire = statistics.mean(sum(s["bytes_sent"].values()) for s in warm)
    payload = statistics.mean(sum(s["payload_bytes"].values()) for s in warm)
    return {"steps_per_s": len(times) / sum(times), "wire": wire, "payload": payload, "steps": len(steps)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet bench transport", description=__doc__)
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="default: all")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side; the best is reported")
    args = parser.parse_args(argv)
    rows = []
    for name in args.case or list(CASES):
        case = copy.deepcopy(CASES[name])
        best_d: dict[str, float] | None = None
        best_r = 0.0
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="vflnet-bench-") as tmp:
                case["run"]["dir"] = tmp
                d = _distributed(case, Path(tmp))
            if best_d is None or d["steps_per_s"] > best_d["steps_per_s"]:
                best_d = d
            ref = train_reference(config_from_dict(copy.deepcopy(case)), evaluate=False)
            best_r = max(best_r, ref.steps_per_second)
            print(
                f"  {name} run {i + 1}: distributed {d['steps_per_s']:.1f} steps/s, reference {ref.steps_per_second:.1f} steps/s",
                flush=True,
            )
        assert best_d is not None
        rows.append((name, best_d, best_r))
    print()
    header = f"{'case':18s} {'distributed':>12s} {'reference':>10s} {'ratio':>6s} {'wire B/step':>12s} {'tensor B/step':>14s} {'overhead':>9s}"
    print(header)
    print("-" * len(header))
    for name, d, r in rows:
        print(
            f"{name:18s} {d['steps_per_s']:12.1f} {r:10.1f} {d['steps_per_s'] / r:6.2f} {d['wire']:12.0f} {d['payload']:14.0f} "
            f"{100 * (d['wire'] / d['payload'] - 1):8.2f}%"
        )
    by_name = {name: d for name, d, _ in rows}
    if "digits-mlp-b256" in by_name and "digits-mlp-b256+tap" in by_name:
        plain, tapped = (
            by_name["digits-mlp-b256"]["steps_per_s"],
            by_name["digits-mlp-b256+tap"]["steps_per_s"],
        )
        print(
            f"\ntrace tap on every party: {1000 / tapped - 1000 / plain:+.2f} ms per step ({100 * (plain / tapped - 1):+.1f}%)"
        )
    print(
        "\nsteps/s: training steps per second (1 torch thread per process; distributed = coordinator-timed step wall time)"
    )
    print(
        "wire: serialized protobuf bytes + 5-byte gRPC frame prefix of every party message in a step; tensor: raw tensor bytes inside"
    )
    return 0
