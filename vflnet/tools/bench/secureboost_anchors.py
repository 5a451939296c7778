"""`vflnet bench secureboost-anchors`: SecureBoost at the production anchors' benchmark settings,
beside xgboost's plaintext tree on the same table and the anchors' published figures, per core.

Two settings (`--anchor`, both by default), each a synthetic binary table of the anchor's shape
(`synthetic`: make_classification, seeded) over the label holder and one passive party:

  fate        FATE 2.0's Hetero-SecureBoost benchmark: guest (label holder) 100,000 x 30, host
              100,000 x 300; FATE 2.0's defaults: 1024-bit Paillier, depth 3, 32 bins;
  secretflow  SecretFlow SGB on creditcard, 284,807 x 30 (15 columns each side; creditcard itself is not
              available offline); 2048-bit keys, depth 5, 32 bins.

Per setting, in one run: one tree of the `secureboost` protocol in HE mode over the loopback bridge
(`--workers` crypto processes: 2 is both cores), the same protocol in plain mode, and xgboost's `hist`
tree (`--workers` threads, same depth and bins, one boosting round, after a warm-up) on the same
columns, at the anchor's own rows (`--xgboost-rows`: it takes seconds). Seconds per tree are the
coordinator's step time (xgboost: the wall time of `DMatrix` and `xgb.train`, binning included); bytes
per tree are every party's messages of that step.

The anchors' full row counts take tens of minutes per HE tree here, so by default the protocol runs
on `--rows` rows (10,000) and on half as many, and its seconds per tree are also given at the
anchor's rows along the line through both (the encryption of gh and the histogram additions grow with
rows; the key, the crypto workers' start and the per-node decryptions do not); xgboost's tree, which
takes seconds, runs on the anchor's rows (`--xgboost-rows`: fewer, scaled in proportion). `--full`
runs the protocol at the anchor's rows. Core-seconds per tree: seconds x the
cores that ran them (this machine: 2; the anchors: as published, every party's machines together).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from vflnet.crypto import shutdown_pools
from vflnet.extras import require
from vflnet.runner.reference import tree_views
from vflnet.tools.bench.common import Row, markdown_table, parse_args, write_json
from vflnet.tools.bench.secureboost import bench_config, run_tree
from vflnet.validation import config_from_dict

CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class Anchor:
    """A published SecureBoost benchmark: its table's shape, its settings and its figure."""

    name: str
    rows: int
    active_columns: int  # the label holder's
    passive_columns: int
    bits: int
    depth: int
    published_s_per_tree: float
    published_cores: int  # every party's machines together
    source: str  # where the figure and the settings come from, and what is assumed


ANCHORS = {
    "fate": Anchor(
        "fate",
        100_000,
        30,
        300,
        1024,
        3,
        131.0,
        32,
        "FATE 2.0 doc/2.0/fate/performance: Hetero-SecureBoost 2m11s/epoch (EggRoll, Paillier; 1m54s/tree "
        "standalone); 2 hosts, Xeon Platinum 8255C 2.5 GHz, 16 cores used on each, 1 Gb LAN; key length, "
        "depth and bins not stated there: FATE 2.0's defaults (1024 bits, depth 3, 32 bins) assumed",
    ),
    "secretflow": Anchor(
        "secretflow",
        284_807,
        15,
        15,
        2048,
        5,
        10.6,
        16,
        "SecretFlow SGB on creditcard: 106 s on a LAN of two 8-core machines; trees, depth and key not "
        "stated where we read it: SGB's defaults (10 boosting rounds: 10.6 s per tree, depth 5) and a "
        "2048-bit key assumed",
    ),
}


def anchor_config(
    anchor: Anchor, mode: str, rows: int, bits: int, depth: int, workers: int
) -> dict[str, Any]:
    """The secureboost run of the anchor's shape: the label holder's columns first, then the passive
    party's."""
    a, total = anchor.active_columns, anchor.active_columns + anchor.passive_columns
    data = bench_config(mode, bits, rows, total, depth, workers)
    data["parties"] = [p for p in data["parties"] if p["name"] != "passive-2"]
    columns = {"active": f"0:{a}", "passive-1": f"{a}:{total}"}
    for party in data["parties"]:
        if party["name"] in columns:
            party["features"] = {"columns": columns[party["name"]]}
    return data


def xgboost_tree(data: dict[str, Any], depth: int, threads: int) -> float:
    """Wall seconds of one xgboost `hist` tree (binning included) on the run's training rows, every
    party's columns side by side, as the protocol's parties hold them (normalised)."""
    xgb = require("xgboost", "vflnet bench secureboost-anchors (its plaintext xgboost column)")
    views = tree_views(config_from_dict(data))
    x = np.hstack([v[views.train_rows] for v in views.xs])
    y = views.y[views.train_rows]
    params = {
        "objective": "binary:logistic",
        "tree_method": "hist",
        "max_depth": depth,
        "max_bin": 32,
        "nthread": threads,
    }
    xgb.train(params, xgb.DMatrix(x[:100], label=y[:100], nthread=threads), num_boost_round=1)  # warm-up
    start = time.perf_counter()
    xgb.train(params, xgb.DMatrix(x, label=y, nthread=threads), num_boost_round=1)
    return time.perf_counter() - start


def at_anchor_rows(anchor: Anchor, rows: int, run: Any) -> tuple[float, float | None]:
    """(seconds on ``rows`` rows, seconds at the anchor's rows) of ``run(rows)``: below the anchor's
    rows, a second run on half the rows gives the cost per row (the line through both: what does not
    grow with rows, the key, the crypto workers' start, the per-node decryptions, is counted once);
    None if the second run was not slower (noise above the per-row cost: no figure rather than a
    wrong one)."""
    full = run(rows)
    if rows >= anchor.rows:
        return full, full
    half = run(rows // 2)
    per_row = (full - half) / (rows - rows // 2)
    return full, (full + per_row * (anchor.rows - rows)) if per_row > 0 else None


def measure(anchor: Anchor, rows: int, xgboost_rows: int, bits: int, depth: int, workers: int) -> list[Row]:
    """The anchor's rows of the table: vflnet HE, vflnet plain, xgboost, and the published figure."""
    sent: dict[tuple[str, int], int] = {}

    def tree(mode: str, n: int) -> float:
        s, b, _ = run_tree(anchor_config(anchor, mode, n, bits, depth, workers if mode == "he" else 1))
        sent[mode, n] = b
        print(f"{anchor.name}: {mode} tree {s:.2f} s on {n} rows", flush=True)
        return s

    runs: list[tuple[str, int, float, float | None, int | None]] = []
    for mode, name in (
        ("he", f"vflnet secureboost, {bits}-bit Paillier, {workers} crypto workers"),
        ("plain", "vflnet secureboost, plain mode"),
    ):
        s, at_anchor = at_anchor_rows(anchor, rows, lambda n, mode=mode: tree(mode, n))
        runs.append((name, rows, s, at_anchor, sent[mode, rows]))
    s = xgboost_tree(anchor_config(anchor, "plain", xgboost_rows, bits, depth, 1), depth, workers)
    runs.append((f"xgboost hist, {workers} threads", xgboost_rows, s, s * anchor.rows / xgboost_rows, None))
    shutdown_pools()
    shape = f"{anchor.active_columns} + {anchor.passive_columns} columns"
    out: list[Row] = [
        {
            "anchor": anchor.name,
            "run": name,
            "rows": n,
            "shape": shape,
            "seconds_per_tree": s,
            "s_per_tree_at_anchor_rows": at_anchor,
            "bytes_per_tree": b,
            "cores": CORES,
            "core_s_per_tree_at_anchor_rows": None if at_anchor is None else at_anchor * CORES,
        }
        for name, n, s, at_anchor, b in runs
    ]
    published = anchor.published_s_per_tree
    out.append(
        {
            "anchor": anchor.name,
            "run": f"{anchor.name} as published ({anchor.bits}-bit, depth {anchor.depth})",
            "rows": anchor.rows,
            "shape": shape,
            "seconds_per_tree": published,
            "s_per_tree_at_anchor_rows": published,
            "bytes_per_tree": None,
            "cores": anchor.published_cores,
            "core_s_per_tree_at_anchor_rows": published * anchor.published_cores,
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vflnet bench secureboost-anchors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--anchor", choices=sorted(ANCHORS), action="append", help="a setting (repeatable; default: both)"
    )
    parser.add_argument("--rows", type=int, default=10_000, help="rows of every run (scaled to the anchor's)")
    parser.add_argument("--full", action="store_true", help="run at the anchor's own row count (slow)")
    parser.add_argument(
        "--xgboost-rows", type=int, default=None, help="rows of xgboost's tree (default: the anchor's)"
    )
    parser.add_argument("--bits", type=int, default=None, help="key size (default: the anchor's)")
    parser.add_argument("--workers", type=int, default=2, help="crypto worker processes and xgboost threads")
    args = parse_args(parser, argv, smoke={"rows": 400, "xgboost_rows": 400, "bits": 512})
    if args.full and args.rows != parser.get_default("rows"):
        parser.error("--full runs the anchor's rows: give --rows or --full, not both")
    if min(args.rows, args.xgboost_rows or 100) < 100 or args.workers < 1:
        parser.error("--rows and --xgboost-rows must be >= 100, --workers >= 1")
    rows_out: list[Row] = []
    for name in args.anchor or sorted(ANCHORS):
        anchor = ANCHORS[name]
        rows = anchor.rows if args.full else min(args.rows, anchor.rows)
        bits = args.bits or anchor.bits
        print(f"{name}: {rows} rows, {bits}-bit keys, depth {anchor.depth} ({anchor.source})", flush=True)
        xgboost_rows = min(args.xgboost_rows or anchor.rows, anchor.rows)
        rows_out += measure(anchor, rows, xgboost_rows, bits, anchor.depth, args.workers)
    load = os.getloadavg()[0]
    print()
    print(markdown_table(rows_out))
    print(
        "\nseconds_per_tree: measured on `rows` rows; s_per_tree_at_anchor_rows: at the anchor's rows, "
        "along the line through the runs on `rows` and `rows` / 2 (xgboost: in proportion; published: as "
        f"published); core_s: x the cores that ran it (here {CORES}). Load average at the end: {load:.2f}"
    )
    write_json(args.json, rows_out, sources={n: a.source for n, a in ANCHORS.items()})
    return 0
