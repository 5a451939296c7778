"""`vflnet bench psi`: private set intersection as vflnet runs it (alignment.method psi, docs/protocols.md)
against openmined-psi on the same sets.

Each party holds N string IDs (e-mail-like), half of them in the intersection, in its own CSV file;
a run over gRPC processes aligns them (`alignment.method: psi`) and trains one step. Figures: the
alignment phase's wall seconds (the coordinator's, from its first `Align` call to the last reply), its
CPU seconds (each party's in its Align calls, and the coordinator's), the peak RSS of every process of
the run (sampled from /proc; its start-up and one step included), and the bytes each party sent in the
phase per ID it holds.

openmined-psi (2.0.4, ECDH PSI with both sides in one process, no network) runs in a child process on
the same two sets where it is importable: `pip install openmined-psi==2.0.4` resolves beside our
protobuf pin, or point $VFLNET_OPENMINED_PATH at a folder it was installed into (`pip install --target`)
to keep it out of the venv. It is two-party only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from vflnet.tools.bench.common import Row, markdown_table, parse_args, run_cluster, scratch, write_json
from vflnet.tools.bench.scaling import Sampler

OPENMINED_ENV = "VFLNET_OPENMINED_PATH"


def ids(party: int, n: int) -> list[str]:
    """Party ``party``'s N IDs: the first half shared by every party, the rest its own."""
    common = [f"user{i:08d}@example.org" for i in range(n // 2)]
    own = [f"p{party}-user{i:08d}@example.org" for i in range(n - n // 2)]
    return common + own


def write_files(folder: Path, n: int, parties: int) -> dict[str, Any]:
    """One CSV per party (IDs and one feature; the active party's with a label) and the run config."""
    roster: list[dict[str, Any]] = [{"name": "coordinator", "role": "coordinator"}]
    for p in range(parties):
        name = "active" if p == 0 else f"passive-{p}"
        path = folder / f"{name}.csv"
        with path.open("w") as fh:
            fh.write("id,x" + (",label\n" if p == 0 else "\n"))
            fh.writelines(
                f"{k},{i % 7},{i % 2}\n" if p == 0 else f"{k},{i % 5}\n" for i, k in enumerate(ids(p, n))
            )
        source: dict[str, Any] = {"path": str(path), "features": ["x"]}
        if p == 0:
            source["label_column"] = "label"
        roster.append(
            {
                "name": name,
                "role": "active" if p == 0 else "passive",
                "source": source,
                "bottom": {"kind": "mlp", "hidden": [], "out": 2},
            }
        )
    return {
        "run": {"id": f"psi-{parties}x{n}", "dir": str(folder / "runs")},
        "alignment": {"method": "psi"},
        "data": {"test_fraction": 0.01},
        "parties": roster,
        "model": {"top": {"kind": "none"}},
        "protocol": {"kind": "split", "aggregation": "sum"},
        "train": {"epochs": 1, "max_steps": 1, "batch_size": 64, "eval_batch_size": 4096},
        "transport": {"join_timeout_s": 3600, "rpc_timeout_s": 600},
    }


def measure(n: int, parties: int) -> Row:
    with scratch("vflnet-bench-psi-") as folder:
        cfg = write_files(folder, n, parties)
        path = folder / "run.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run_dir = folder / "run"
        sampler = Sampler(run_dir, 1)
        sampler.start()
        start = time.perf_counter()
        try:
            run_cluster(path, run_dir)
        finally:
            sampler.stop.set()
            sampler.join()
        wall = time.perf_counter() - start
        record = json.loads((run_dir / "alignment.json").read_text())
        party_cpu = [json.loads(f.read_text())["cpu_s"] for f in run_dir.glob("alignment-*.json")]
    sent = [v for k, v in record["wire_bytes"].items() if k != "coordinator"]
    return {
        "impl": "vflnet psi (gRPC processes)",
        "parties": parties,
        "ids_per_party": n,
        "common": record["n_common"],
        "align_s": round(record["seconds"], 2),
        "run_s": round(wall, 2),
        "align_cpu_s": round(sum(party_cpu) + record["coordinator_cpu_s"], 1),
        "max_party_cpu_s": round(max(party_cpu), 1),
        "peak_rss_mib": round(max(u.peak_rss_mib for u in sampler.usage.values()), 1),
        "party_bytes_per_id": round(sum(sent) / len(sent) / n, 1),
        "coordinator_bytes_per_id": round(record["wire_bytes"]["coordinator"] / (parties * n), 1),
    }


OPENMINED = """
import json, resource, sys, time
import private_set_intersection.python as psi
sys.path.insert(0, sys.argv[2])
from vflnet.tools.bench.psi import ids
n = int(sys.argv[1])
a, b = ids(0, n), ids(1, n)
t, c0 = time.perf_counter(), time.process_time()
client, server = psi.client.CreateWithNewKey(True), psi.server.CreateWithNewKey(True)
setup = server.CreateSetupMessage(1e-9, len(a), b, psi.DataStructure.RAW)
request = client.CreateRequest(a)
response = server.ProcessRequest(request)
common = client.GetIntersection(setup, response)
wall, cpu = time.perf_counter() - t, time.process_time() - c0
sizes = [len(m.SerializeToString()) for m in (setup, request, response)]
print(json.dumps({"common": len(common), "s": wall, "cpu": cpu, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "bytes": sizes}))
"""


def openmined(n: int) -> Row | str:
    """openmined-psi on parties 0 and 1's sets in a child process, or why it did not run."""
    env = dict(os.environ)
    extra = env.get(OPENMINED_ENV)
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra, env.get("PYTHONPATH", "")])
    repo = str(Path(__file__).resolve().parents[3])
    done = subprocess.run(
        [sys.executable, "-c", OPENMINED, str(n), repo], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"openmined-psi did not run: {last}"
    r = json.loads(done.stdout)
    return {
        "impl": "openmined-psi 2.0.4 (one process, no network)",
        "parties": 2,
        "ids_per_party": n,
        "common": r["common"],
        "align_s": round(r["s"], 2),
        "run_s": round(r["s"], 2),
        "align_cpu_s": round(r["cpu"], 1),
        "max_party_cpu_s": None,
        "peak_rss_mib": round(r["rss"], 1),
        "party_bytes_per_id": round((r["bytes"][0] + r["bytes"][2]) / 2 / n, 1),  # server: setup, response
        "coordinator_bytes_per_id": None,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vflnet bench psi", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="IDs per party")
    p.add_argument("--parties", type=int, nargs="+", default=[2, 3], help="parties holding IDs")
    p.add_argument(
        "--max-three-party-size",
        type=int,
        default=100_000,
        help="largest size run with three or more parties (each party re-blinds every other set)",
    )
    p.add_argument("--no-openmined", action="store_true", help="leave openmined-psi out")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv, {"sizes": [2000], "parties": [2, 3]})
    rows: list[Row] = []
    notes: list[str] = []
    for n in args.sizes:
        for k in args.parties:
            if k > 2 and n > args.max_three_party_size:
                notes.append(
                    f"{k} parties x {n}: not run (--max-three-party-size {args.max_three_party_size})"
                )
                continue
            rows.append(measure(n, k))
            print(markdown_table(rows[-1:]), flush=True)
        if not args.no_openmined:
            got = openmined(n)
            if isinstance(got, str):
                notes.append(got)
            else:
                rows.append(got)
    print(f"\nprivate set intersection, N string IDs per party, half common; {os.cpu_count()} cores\n")
    print(markdown_table(rows))
    print(
        "\nalign_s: the alignment phase (coordinator's wall time); run_s: the whole run (start-up, one "
        "training step, shutdown); align_cpu_s: CPU seconds of the phase, every party's (in its Align calls) and "
        "the coordinator's; max_party_cpu_s: the busiest party's; peak_rss_mib: the largest VmHWM of the run's "
        "processes; "
        "party_bytes_per_id: bytes a party sends in the phase per ID it holds (its offer and the sets it "
        "re-blinds); coordinator_bytes_per_id: what the coordinator sends, per ID and party"
    )
    for note in notes:
        print(f"note: {note}")
    write_json(args.json, rows, notes=notes)
    return 0
