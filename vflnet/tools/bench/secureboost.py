"""`vflnet bench secureboost`: seconds and bytes per tree of the `secureboost` protocol.

One depth-`--depth` tree over a synthetic binary task (`--rows` x `--features`, the features split
between the label holder and two passive parties), at `--bits`:

  engine     the real protocol in HE mode (vflnet/protocols/secureboost.py) over the loopback bridge,
             1 crypto worker, then `--workers` (both cores);
  phe        the same tree grown on python-paillier objects, one EncryptedNumber per value, every party
             in this process (vflnet/tools/bench/secureboost_phe.py: phe has no arrays or wire format to run
             the protocol's messages on); checked to grow the same tree as the plaintext algorithm;
  phe model  the cost model `vflnet bench he-step` uses (the engine counts per-value operations while
             the real protocol runs, `vflnet.crypto.opcount`, times python-paillier's cost per operation
             under a key of the same size): printed beside the phe run as a check of that model;
  plaintext  the same protocol in plain mode.

Seconds per tree are the coordinator's step time (metrics.jsonl) for the protocol runs and the wall
time from the gh encryption to the grown tree for phe; bytes per tree are what every party sent in
that step (phe: the ciphertexts, 2 * bits / 8 bytes each). Engine-only work (packing gh, packing
histogram entries) has no per-value counterpart and costs phe nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from vflnet.crypto import generate_keypair, opcount, shutdown_pools
from vflnet.models.secureboost import TreeParams
from vflnet.runner.loopback import LoopbackFailure, run_loopback
from vflnet.runner.reference import tree_views
from vflnet.tools.bench.common import parse_args, scratch, write_json
from vflnet.tools.bench.secureboost_phe import phe_tree
from vflnet.validation import config_from_dict


def bench_config(mode: str, bits: int, rows: int, features: int, depth: int, workers: int) -> dict[str, Any]:
    """Label holder: the first third of the features; two passive parties: the rest, halved."""
    a = features // 3
    b = a + (features - a) // 2
    cols = {"active": f"0:{a}", "passive-1": f"{a}:{b}", "passive-2": f"{b}:{features}"}
    parties = [{"name": "coordinator", "role": "coordinator"}] + [
        {
            "name": name,
            "role": "active" if name == "active" else "passive",
            "features": {"columns": cols[name]},
            "bottom": {"kind": "splits", "out": 2},
        }
        for name in cols
    ]
    return {
        "run": {"seed": 0},
        "protocol": {
            "kind": "secureboost",
            "aggregation": "sum",
            "params": {
                "mode": mode,
                "max_depth": depth,
                "n_bins": 32,
                "workers": workers,
                # the key only in the HE mode: the plain mode does not read it (and refuses it)
                **({"key_bits": bits, "allow_insecure_keys": bits < 1024} if mode == "he" else {}),
            },
        },
        "data": {
            "dataset": "synthetic",
            "params": {
                "n_samples": rows,
                "n_features": features,
                "n_informative": features // 2,
                "n_classes": 2,
            },
            "test_fraction": 0.01,
        },
        "parties": parties,
        "model": {"top": {"kind": "none"}},
        "train": {"epochs": 1, "batch_size": 10**9},
        "transport": {"rpc_timeout_s": 3600, "max_message_mb": 1024, "max_payload_mb": 1024},
    }


def run_tree(data: dict[str, Any]) -> tuple[float, int, dict[str, float]]:
    """(seconds, bytes sent by every party, per-value op counts) of the tree's training step."""
    with scratch("vflnet-bench-sb-") as tmp:
        data["run"].update(dir=str(tmp), id="run")
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        with opcount.counting() as counter:
            try:
                run_loopback(config_from_dict(data), run_dir)
            except LoopbackFailure:
                print((run_dir / "logs" / "loopback.log").read_text()[-4000:])
                raise
        step = next(
            r
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "step"
        )
    counts = counter.counts.get("")
    ops = {k: float(counts[k]) for k in opcount.KINDS} if counts else {}
    return float(step["step_time_s"]), int(sum(step["bytes_sent"].values())), ops


def _bytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vflnet bench secureboost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument(
        "--workers", type=int, default=2, help="crypto worker processes of the second engine run"
    )
    args = parse_args(parser, argv, smoke={"rows": 300, "features": 6, "bits": 512, "depth": 2, "workers": 1})
    from vflnet.tools.bench.he_step import phe_costs

    print(
        f"one depth-{args.depth} tree, {args.rows} x {args.features} (synthetic, binary), {args.bits}-bit keys",
        flush=True,
    )
    results: list[tuple[str, float, float]] = []
    engine_s, engine_b, ops = run_tree(bench_config("he", args.bits, args.rows, args.features, args.depth, 1))
    results.append(("engine, 1 worker", engine_s, engine_b))
    print(f"engine (1 worker): {engine_s:.2f} s, {_bytes(engine_b)}; per-value ops {ops}", flush=True)
    if args.workers > 1:
        s, b, _ = run_tree(bench_config("he", args.bits, args.rows, args.features, args.depth, args.workers))
        results.append((f"engine, {args.workers} workers", s, b))
        print(f"engine ({args.workers} workers): {s:.2f} s", flush=True)
    public, private = generate_keypair(args.bits, allow_insecure=args.bits < 1024)
    wall, _ = phe_costs(public.to_phe(), private.to_phe())
    model_s = sum(ops.get(k, 0.0) * wall.ops[k] for k in ("encrypt", "add", "obfuscate", "decrypt"))
    width = 2 * args.bits // 8
    model_b = (ops.get("encrypt", 0.0) * 2 + ops.get("obfuscate", 0.0)) * width  # gh to both passive parties
    print(
        f"phe cost model: {model_s:.1f} s (per value: { {k: f'{v * 1e6:.1f} us' for k, v in wall.ops.items()} })"
    )
    views = tree_views(
        config_from_dict(bench_config("he", args.bits, args.rows, args.features, args.depth, 1))
    )
    phe_run = phe_tree(
        views.xs, views.y, views.n_classes, TreeParams(args.depth, n_bins=32), views.train_rows, args.bits
    )
    if not phe_run.same_tree:
        raise SystemExit("the phe tree differs from the plaintext algorithm's: the phe run is wrong")
    phe_s = phe_run.seconds
    results.append(("phe (one EncryptedNumber per value, one process)", phe_s, phe_run.bytes_sent))
    results.append(("phe cost model (he-step's method)", model_s, model_b))
    print(
        f"phe: {phe_s:.1f} s ({phe_run.cpu_seconds:.1f} CPU s), {_bytes(phe_run.bytes_sent)}, "
        "the same tree as the plaintext algorithm",
        flush=True,
    )
    s, b, _ = run_tree(bench_config("plain", args.bits, args.rows, args.features, args.depth, 1))
    results.append(("plaintext", s, b))
    shutdown_pools()
    load = os.getloadavg()[0]
    print("\n| run | seconds per tree | bytes per tree | phe / run |\n|---|---|---|---|")
    for name, s, b in results:
        print(f"| {name} | {s:.2f} | {_bytes(b)} | {phe_s / s:.1f}x |")
    print(f"\nload average at the end: {load:.2f} (2 cores shared)")
    write_json(
        args.json,
        [{"run": name, "seconds_per_tree": s, "bytes_per_tree": b} for name, s, b in results],
        setting=f"depth {args.depth}, {args.rows} x {args.features}, {args.bits}-bit keys",
    )
    return 0
