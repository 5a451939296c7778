"""`vflnet bench transport`: the transports next to the in-process reference, in one invocation.

Three cases, each also with a trace tap on every party (``+tap``): the digits MLP at batch 256, the
MNIST CNN at batch 128 and a logistic regression on breast_cancer at batch 64. For each it trains the
same model three times: as a local cluster of real processes over gRPC,
with every role in one process over the loopback bridge (the same protocol code and mod chains,
messages still serialized), and in the reference trainer with no transport, no roles and no protocol.
It prints steps/s of each, each transport's ratio to the reference and its overhead in milliseconds
per step, and bytes on the wire per step against the raw tensor bytes those messages carry.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from vflnet.runner.reference import train_reference
from vflnet.tools.bench.common import parse_args, run_cluster, scratch, write_json
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

# Logistic regression split by columns: each passive party's linear bottom gives its share of the two
# logits, the active party (labels only) sums them (no top model). A step is well under a millisecond
# of compute, so this case is almost all platform overhead.
CANCER_LR: dict[str, Any] = {
    "run": {"id": "bench-cancer-lr", "seed": 0},
    "protocol": {"kind": "split", "aggregation": "sum"},
    "data": {"dataset": "breast_cancer"},
    "parties": [
        {"name": "coordinator", "role": "coordinator"},
        {"name": "active", "role": "active"},
        {
            "name": "passive-1",
            "role": "passive",
            "features": {"columns": "0:15"},
            "bottom": {"kind": "linear", "out": 2},
        },
        {
            "name": "passive-2",
            "role": "passive",
            "features": {"columns": "15:30"},
            "bottom": {"kind": "linear", "out": 2},
        },
    ],
    "model": {"top": {"kind": "none"}},
    "train": {"epochs": 20, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 0.01}, "eval_every": 100},
}


def _tapped(case: dict[str, Any]) -> dict[str, Any]:
    """The same run with every party's wire recorded by a trace tap: the cost of a tap per step."""
    return {**copy.deepcopy(case), "trace": {"parties": ["all"]}}


BRIDGES = ("grpc", "loopback")
BASE_CASES = {"digits-mlp-b256": DIGITS_MLP, "mnist-cnn-b128": MNIST_CNN, "cancer-lr-b64": CANCER_LR}
TAP = "+tap"
CASES = {
    name: variant
    for base, case in BASE_CASES.items()
    for name, variant in ((base, case), (base + TAP, _tapped(case)))
}


def distributed(case: dict[str, Any], workdir: Path, bridge: str) -> dict[str, Any]:
    case = copy.deepcopy(case)
    case.setdefault("transport", {})["bridge"] = bridge
    path = workdir / f"{bridge}.yaml"
    path.write_text(yaml.safe_dump(case))
    run_dir = workdir / bridge
    run_cluster(path, run_dir, shown=True)  # its readers follow each run
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "step"]
    warm = steps[2:] if len(steps) > 4 else steps  # first steps include connection set-up
    # a coordinated checkpoint (every epoch by default) is durability, not transport: its step, and the
    # next one (sent only once the checkpoint is written), are timed apart
    after_checkpoint = {s["step"] + 1 for s in warm if s.get("checkpoint")}
    touched = [s for s in warm if s.get("checkpoint") or s["step"] in after_checkpoint]
    plain = [s for s in warm if s not in touched] or warm
    per_step = statistics.mean(s["step_time_s"] for s in plain)
    checkpoints = sum(1 for s in warm if s.get("checkpoint"))
    extra = sum(s["step_time_s"] - per_step for s in touched)
    wire = statistics.mean(sum(s["bytes_sent"].values()) for s in warm)
    payload = statistics.mean(sum(s["payload_bytes"].values()) for s in warm)
    return {
        "steps_per_s": 1 / per_step,
        "checkpoint_ms": 1000 * extra / checkpoints if checkpoints else 0.0,
        "wire": wire,
        "payload": payload,
        "steps": len(steps),
        "step_times": [(s["step"], s["step_time_s"]) for s in plain],  # (step, seconds), in order
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vflnet bench transport", description=__doc__)
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="default: all")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side; the best is reported")
    args = parse_args(parser, argv, smoke={"case": ["digits-mlp-b256"]})
    _report(args, _measure(args))  # Ctrl-C, SIGTERM: vflnet.tools.bench.cli stops every benchmark alike
    return 0


def _measure(args: argparse.Namespace) -> list[tuple[str, dict[str, dict[str, float]], float]]:
    """Each case's best run per bridge and its best reference rate."""
    rows = []
    for name in args.case or list(CASES):
        case = copy.deepcopy(CASES[name])
        best: dict[str, dict[str, float]] = {}
        best_r = 0.0
        for i in range(args.repeat):
            for bridge in BRIDGES:
                with scratch("vflnet-bench-") as tmp:
                    case["run"]["dir"] = str(tmp)
                    d = distributed(case, Path(tmp), bridge)
                if bridge not in best or d["steps_per_s"] > best[bridge]["steps_per_s"]:
                    best[bridge] = d
            ref = train_reference(config_from_dict(copy.deepcopy(case)), evaluate=False)
            best_r = max(best_r, ref.steps_per_second)
            print(
                f"  {name} run {i + 1}: "
                + ", ".join(f"{b} {best[b]['steps_per_s']:.1f}" for b in BRIDGES)
                + f", reference {ref.steps_per_second:.1f} steps/s",
                flush=True,
            )
        rows.append((name, best, best_r))
    return rows


def _report(args: argparse.Namespace, rows: list[tuple[str, dict[str, dict[str, float]], float]]) -> None:
    print()
    header = (
        f"{'case':22s} {'grpc':>7s} {'loopback':>9s} {'reference':>10s} {'grpc/ref':>9s} {'grpc +ms':>9s} "
        f"{'loop/ref':>9s} {'loop +ms':>9s} {'ckpt +ms':>9s} {'wire B/step':>12s} {'tensor B/step':>14s} "
        f"{'overhead':>9s}"
    )
    print(header)
    print("-" * len(header))
    for name, best, r in rows:
        g, lo = best["grpc"], best["loopback"]
        print(
            f"{name:22s} {g['steps_per_s']:7.1f} {lo['steps_per_s']:9.1f} {r:10.1f} {g['steps_per_s'] / r:9.2f} "
            f"{_ms(g, r):9.2f} {lo['steps_per_s'] / r:9.2f} {_ms(lo, r):9.2f} {g['checkpoint_ms']:9.1f} {g['wire']:12.0f} "
            f"{g['payload']:14.0f} {100 * (g['wire'] / g['payload'] - 1):8.2f}%"
        )
    by_name = {name: best for name, best, _ in rows}
    for base in BASE_CASES:
        if base in by_name and base + TAP in by_name:
            print()
            for bridge in BRIDGES:
                plain = by_name[base][bridge]["steps_per_s"]
                tapped = by_name[base + TAP][bridge]["steps_per_s"]
                print(
                    f"trace tap on every party, {base} ({bridge}): {1000 / tapped - 1000 / plain:+.2f} ms per step "
                    f"({100 * (plain / tapped - 1):+.1f}% of the step)"
                )
    print(
        "\nsteps/s: training steps per second (1 torch thread per role; grpc and loopback = coordinator-timed step wall time,"
        " between the completions of consecutive steps, checkpoint steps apart)"
    )
    print(
        "ckpt +ms: what one coordinated checkpoint (every party's state written durably, then the manifest) adds, over gRPC"
    )
    print("+ms: per-step overhead, what the transport adds to each step over the reference, in milliseconds")
    print(
        "wire: serialized protobuf bytes + 5-byte gRPC frame prefix of every party message in a step; tensor: raw tensor bytes inside"
    )
    figures = [
        {
            "case": name,
            "grpc_steps_per_s": best["grpc"]["steps_per_s"],
            "loopback_steps_per_s": best["loopback"]["steps_per_s"],
            "reference_steps_per_s": r,
            "grpc_checkpoint_ms": best["grpc"]["checkpoint_ms"],
            "wire_bytes_per_step": best["grpc"]["wire"],
            "tensor_bytes_per_step": best["grpc"]["payload"],
        }
        for name, best, r in rows
    ]
    write_json(args.json, figures)


def _ms(d: dict[str, float], reference_steps_per_s: float) -> float:
    return 1000 / d["steps_per_s"] - 1000 / reference_steps_per_s
