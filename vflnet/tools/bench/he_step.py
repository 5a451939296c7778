"""`vflnet bench he-step`: seconds and bytes per training step of split-he against python-paillier.

The model is paper 004's MLP on digits: two passive parties each hold one 32-feature half, each
bottom is Linear(32, 32) - ReLU - Linear(32, 10), the logits are summed, the top model is the
identity, and the active party holds only the labels. For every key size and batch size it shows

  split      plaintext split learning, distributed (real processes over gRPC);
  split-he   paper 004 Algorithm 1 with the vflnet engine, distributed the same way;
  engine     the same split-he protocol code with every role in this process over the loopback
             bridge (vflnet.runner.loopback): 1 crypto worker, and a pool of `--workers` processes;
  phe        the same step's cryptographic work with python-paillier (gmpy2): one EncryptedNumber
             per value, as a cost model counted from the real step (below).

All step times are the coordinator's, from metrics.jsonl, over training steps 2..N (step 1 also
builds every party's encryption table). Under the loopback bridge the two passive parties' crypto
shares one interpreter, as it did in one process before; the distributed step runs them in parallel.

Why phe is a cost model and not a second run of the protocol: the protocol's cryptography is the
vflnet engine's array type (packed `CipherArray` arithmetic, masked decryption, backpropagation
over ciphertexts in `vflnet.protocols.he_backprop`). python-paillier has no arrays, no packing and
no multi-exponentiation, so running the protocol on it would need a second implementation of the
step, stage for stage: the copy of the step order this bench used to keep (`engine_step` and
`phe_step`, removed). Instead, while the real step runs, the engine counts the work in per-value
operations (`vflnet.crypto.opcount`: what an implementation with one EncryptedNumber per value does
for each engine operation), per party; python-paillier is timed on each primitive with the same key
and the same fixed point (encryption, ciphertext addition, plaintext addition, ciphertext x
plaintext product by the multiplier's bit length and sign, re-randomisation, decryption), and the
step's phe time is the sum of counts x costs. Engine-only work (packing, rescaling) has no per-value
counterpart and costs phe nothing. The one place where the protocol's packed layout adds values a
per-value implementation would not have is the passive parties' parameter gradient (padding slots
of its packed rows, e.g. 1,743 slots for 1,386 parameters at 2048 bits): there phe masks,
re-randomises and decrypts one value per parameter.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import phe
import torch
import yaml

from vflnet.crypto import generate_keypair, opcount
from vflnet.crypto.masking import STATISTICAL_BITS
from vflnet.crypto.opcount import OpCounts
from vflnet.crypto.parallel import shutdown_pools
from vflnet.protocols.he_backprop import MULTIPLIER_BITS
from vflnet.protocols.he_settings import HE_PARAMS
from vflnet.runner.loopback import run_loopback
from vflnet.tools.bench.common import parse_args, run_cluster, scratch, write_json
from vflnet.validation import config_from_dict

FRAC_BITS = HE_PARAMS["frac_bits"].default  # fixed-point scale of the encrypted logits and of [[g]]
PHE_VALUE_BITS = 32  # phe tracks no bounds: its masks assume |value| < 2^32
HIDDEN, LOGITS, HALF = 32, 10, 32
STAGES = ("encrypt logits", "aggregate", "encrypt g", "backprop", "gradient")
PASSIVES = ("passive-1", "passive-2")

# The paper 004 digits MLP as a run config; the benchmark fills in protocol, key size, batch and steps.
# No evaluation and so no test set (`eval_every: 0`): the run ends with the training steps, nothing but
# steps counted.
PAPER_004_DIGITS: dict[str, Any] = {
    "run": {"id": "bench-he-step", "seed": 0},
    "protocol": {"kind": "split-he", "aggregation": "sum"},
    "data": {"dataset": "digits", "test_fraction": 1e-4},
    "parties": [
        {"name": "coordinator", "role": "coordinator"},
        {"name": "active", "role": "active"},
        {
            "name": "passive-1",
            "role": "passive",
            "features": {"columns": "0:32"},
            "bottom": {"kind": "mlp", "hidden": [HIDDEN], "out": LOGITS},
        },
        {
            "name": "passive-2",
            "role": "passive",
            "features": {"columns": "32:64"},
            "bottom": {"kind": "mlp", "hidden": [HIDDEN], "out": LOGITS},
        },
    ],
    "model": {"top": {"kind": "none"}},
    "train": {
        "epochs": 100,
        "batch_size": 32,
        "max_steps": 3,
        "eval_every": 0,
        "optimizer": {"kind": "sgd", "lr": 0.1},
    },
    "transport": {"rpc_timeout_s": 600, "join_timeout_s": 300},
}


def bench_config(
    kind: str, bits: int, batch: int, steps: int, seed: int = 0, workers: int = 1, bridge: str = "grpc"
) -> dict[str, Any]:
    """PAPER_004_DIGITS under protocol `kind` (split or split-he) with this key size, batch and steps."""
    cfg = copy.deepcopy(PAPER_004_DIGITS)
    cfg["run"]["seed"] = seed
    cfg["protocol"]["kind"] = kind
    if kind == "split-he":
        cfg["protocol"]["params"] = {
            "key_bits": bits,
            "frac_bits": FRAC_BITS,
            "workers": workers,
            "allow_insecure_keys": bits < 1024,  # the smallest settings of the bench and its tests
        }
    cfg["train"].update(batch_size=batch, max_steps=steps)
    cfg["transport"]["bridge"] = bridge
    return cfg


@dataclass
class StepTimes:
    step_s: float  # mean coordinator-timed step wall time, first step excluded
    bytes_per_step: float
    timed_steps: int
    cpu_s: float | None = None  # CPU seconds of this process per step, first step excluded (loopback runs)


def step_times(run_dir: Path, steps: int) -> StepTimes:
    """Bytes per step are the run's total over all training steps divided by their number: the active
    party meters its gradient replies on the RPC thread, so a reply can land in the next step's report."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "step"]
    if len(train) != steps:
        raise RuntimeError(f"expected {steps} training steps in metrics.jsonl, found {len(train)}")
    timed = train[1:]  # the first step also builds each party's encryption table
    total_bytes = sum(sum(r["bytes_sent"].values()) for r in train)
    return StepTimes(statistics.mean(r["step_time_s"] for r in timed), total_bytes / len(train), len(timed))


# --------------------------------------------------------------------------------- distributed
def run_distributed(kind: str, bits: int, batch: int, steps: int, seed: int = 0) -> StepTimes:
    """Train `steps` steps on a local cluster of real processes and read the coordinator's metrics."""
    cfg = bench_config(kind, bits, batch, steps, seed)
    with scratch("vflnet-he-step-") as tmp:
        cfg["run"]["dir"] = str(tmp)
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run_dir = Path(tmp) / "run"
        run_cluster(path, run_dir)
        return step_times(run_dir, steps)


# ------------------------------------------------------------------------ engine (loopback)
def party_of_thread() -> str:
    """The party whose work the current thread does in a loopback run: its role thread is named after
    it, its servers' threads `<name>-loop_<i>`."""
    return threading.current_thread().name.split("-loop")[0]


class StepCpu:
    """CPU seconds of this process between the end of the first training step and the end of the last
    (`run_loopback`'s ticks, every 0.1 s: watches metrics.jsonl); under load a steadier figure than wall time."""

    def __init__(self, run_dir: Path, steps: int) -> None:
        self.path, self.steps = run_dir / "metrics.jsonl", steps
        self.marks: dict[int, float] = {}

    def __call__(self) -> None:
        if len(self.marks) == 2 or not self.path.exists():
            return
        done = sum(1 for line in self.path.read_text().splitlines() if '"kind": "step"' in line)
        for mark in (1, self.steps):
            if done >= mark and mark not in self.marks:
                self.marks[mark] = time.process_time()

    def per_step(self) -> float | None:
        if len(self.marks) < 2 or self.steps < 2:
            return None
        return (self.marks[self.steps] - self.marks[1]) / (self.steps - 1)


@dataclass
class EngineRun:
    times: StepTimes
    counts: dict[str, OpCounts]  # per party, per training step (mean over the run's steps)
    n_params: dict[str, int]  # every passive party's parameter count (the values of its gradient)


def run_engine(
    bits: int,
    batch: int,
    steps: int,
    seed: int = 0,
    workers: int = 1,
    kind: str = "split-he",
    run_dir: Path | None = None,
) -> EngineRun:
    """The real protocol in this process over the loopback bridge, the engine's work counted per party
    (`vflnet.crypto.opcount`); `run_dir` keeps the run (default: a temporary directory)."""
    data = bench_config(kind, bits, batch, steps, seed, workers, bridge="loopback")
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = Path(stack.enter_context(scratch("vflnet-he-step-"))) / "run"
        data["run"].update(dir=str(run_dir.parent), id=run_dir.name)
        cfg = config_from_dict(data)
        run_dir.mkdir(parents=True, exist_ok=True)
        cpu = StepCpu(run_dir, steps)
        with opcount.counting(party_of_thread) as counter:
            run_loopback(cfg, run_dir, on_tick=cpu)
        cpu()  # a run shorter than a tick
        times = step_times(run_dir, steps)
        times.cpu_s = cpu.per_step()
        n_params = {}
        for party in PASSIVES:
            modules = torch.load(run_dir / "checkpoints" / f"{party}.pt")["modules"]
            n_params[party] = sum(int(v.numel()) for state in modules.values() for v in state.values())
    counts = {party: c.scaled(1 / steps) for party, c in counter.counts.items()}
    return EngineRun(times, counts, n_params)


# ------------------------------------------------------------------------------ python-paillier
@dataclass
class PheCosts:
    """Seconds of one python-paillier operation on one value, by kind (products by multiplier size)."""

    ops: dict[str, float]
    mul: dict[tuple[int, bool], float] = field(default_factory=dict)


def _time_each(fn: Callable[[Any], Any], items: list[Any], repeats: int = 5) -> tuple[float, float]:
    """Median over `repeats` of the mean seconds of `fn` over `items`: wall time and CPU time."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        for item in items:
            fn(item)
        wall.append((time.perf_counter() - start) / len(items))
        cpu.append((time.process_time() - cpu_start) / len(items))
    return statistics.median(wall), statistics.median(cpu)


def phe_costs(
    pk: phe.PaillierPublicKey,
    sk: phe.PaillierPrivateKey,
    products: Iterable[tuple[int, bool]] = (),
    samples: int = 12,
) -> tuple[PheCosts, PheCosts]:
    """Time python-paillier on each primitive, one value at a time with the engine's fixed point (under a
    key of the size the protocol's key has):
    encrypting 2^-20 fixed-point numbers, adding two ciphertexts, adding a plaintext (a mask of
    32 + 40 bits), multiplying by a plaintext of each (bits, negative) in `products`, re-randomising a
    computed ciphertext for the wire (`be_secure`) and decrypting. Returns the costs in wall time and in
    CPU time."""
    rng = np.random.default_rng(0)

    def encoded(v: int) -> phe.EncodedNumber:
        return phe.EncodedNumber(pk, v % pk.n, -FRAC_BITS)

    values = [int(v) for v in rng.integers(-(1 << 24), 1 << 24, size=samples)]
    cts = [pk.encrypt(encoded(v)) for v in values]
    computed = [c + d for c, d in zip(cts, reversed(cts), strict=True)]  # not fresh: needs obfuscation
    span = 1 << (PHE_VALUE_BITS + STATISTICAL_BITS)
    masks = [encoded(secrets.randbelow(2 * span + 1) - span) for _ in range(samples)]
    many = cts * 20
    ops: dict[str, tuple[float, float]] = {
        "encrypt": _time_each(lambda v: pk.encrypt(encoded(v)), values),
        "add": _time_each(lambda ab: ab[0] + ab[1], list(zip(many, reversed(many), strict=True))),
        "add_plain": _time_each(lambda cm: cm[0] + cm[1], list(zip(cts * 20, masks * 20, strict=True))),
        # a computed number, re-randomised for the wire (each one afresh: phe obfuscates a number once)
        "obfuscate": _time_each(
            lambda c: phe.EncryptedNumber(pk, c.ciphertext(False)).ciphertext(True), computed
        ),
        "decrypt": _time_each(sk.decrypt_encoded, computed),
    }
    mul = {}
    for bits, negative in sorted(set(products)):
        low = 0 if bits == 0 else 1 << (bits - 1)  # |factor| has exactly `bits` bits
        factors = [(low + secrets.randbelow(low or 1)) * (-1 if negative else 1) for _ in range(samples * 4)]
        pairs = [(c, phe.EncodedNumber(pk, f % pk.n, 0)) for c, f in zip(cts * 4, factors, strict=True)]
        mul[(bits, negative)] = _time_each(lambda cf: cf[0] * cf[1], pairs)
    return (
        PheCosts({k: v[0] for k, v in ops.items()}, {k: v[0] for k, v in mul.items()}),
        PheCosts({k: v[1] for k, v in ops.items()}, {k: v[1] for k, v in mul.items()}),
    )


def phe_stages(run: EngineRun, active: str, costs: PheCosts) -> dict[str, float]:
    """Seconds per step of the counted work with python-paillier, by protocol stage. The decryptions at
    the coordinator are those the parties masked: the active party's aggregate and each passive party's
    gradient, one value per parameter."""
    ops = costs.ops
    stages = dict.fromkeys(STAGES, 0.0)
    a = run.counts.get(active, OpCounts())
    stages["aggregate"] = (
        a["add"] * ops["add"]
        + a["add_plain"] * (ops["add_plain"] + ops["decrypt"])
        + a["obfuscate"] * ops["obfuscate"]
    )
    stages["encrypt g"] = a["encrypt"] * ops["encrypt"]
    for party in PASSIVES:
        p = run.counts.get(party, OpCounts())
        stages["encrypt logits"] += p["encrypt"] * ops["encrypt"]
        stages["backprop"] += p["add"] * ops["add"] + sum(n * costs.mul[key] for key, n in p.mul_bits.items())
        stages["gradient"] += run.n_params[party] * (ops["add_plain"] + ops["obfuscate"] + ops["decrypt"])
    return stages


# ------------------------------------------------------------------------------------- report
@dataclass
class Row:
    bits: int
    batch: int
    split: StepTimes
    split_he: StepTimes
    engine: EngineRun  # 1 crypto worker, counted
    engine_n: EngineRun | None  # `workers` crypto workers (None when workers == 1)
    phe: dict[str, float]  # seconds per step by stage
    phe_cpu: dict[str, float]  # the same in CPU seconds
    load: float  # 1-minute load average when the row's in-process runs ended

    @property
    def phe_s(self) -> float:
        return sum(self.phe.values())

    def figures(self) -> dict[str, float | int | None]:
        """The row's figures for `vflnet bench --json` (seconds per step, bytes per step)."""
        return {
            "bits": self.bits,
            "batch": self.batch,
            "split_s_per_step": self.split.step_s,
            "split_he_s_per_step": self.split_he.step_s,
            "engine_s_per_step": self.engine.times.step_s,
            "engine_workers_s_per_step": self.engine_n.times.step_s if self.engine_n else None,
            "phe_s_per_step": self.phe_s,
            "split_bytes_per_step": self.split.bytes_per_step,
            "split_he_bytes_per_step": self.split_he.bytes_per_step,
        }

    @property
    def cpu_ratio(self) -> float | None:
        """phe / engine (1 worker) in CPU seconds of this process: little changed by other jobs."""
        cpu = self.engine.times.cpu_s
        return sum(self.phe_cpu.values()) / cpu if cpu else None


def _fmt_bytes(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def _counts_line(run: EngineRun, active: str) -> str:
    a = run.counts.get(active, OpCounts())
    p = [run.counts.get(name, OpCounts()) for name in PASSIVES]
    mask = sum(c["add_plain"] for c in p)
    return (
        f"per step: {sum(c['encrypt'] for c in p) + a['encrypt']:,.0f} encryptions, "
        f"{a['add'] + sum(c['add'] for c in p):,.0f} additions, {sum(c['mul'] for c in p):,.0f} products, "
        f"{a['add_plain'] + sum(run.n_params.values()):,.0f} masked + decrypted values "
        f"(engine's packed layout: {a['add_plain'] + mask:,.0f})"
    )


def _print_table(rows: list[Row], steps: int, workers: int) -> None:
    nw = f"{workers}w"
    header = (
        f"{'bits':>5} {'batch':>5} {'split s/step':>12} {'split-he s/step':>15} {'engine s':>9} "
        f"{'engine ' + nw + ' s':>12} {'phe s':>9} {'phe/engine':>10} {'phe/engine ' + nw:>13} "
        f"{'cpu phe/engine':>14} {'phe/split-he':>12} {'split B/step':>13} {'split-he B/step':>15} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        n_s = f"{r.engine_n.times.step_s:12.3f}" if r.engine_n else f"{'-':>12}"
        n_x = f"{r.phe_s / r.engine_n.times.step_s:12.1f}x" if r.engine_n else f"{'-':>13}"
        cpu_x = f"{r.cpu_ratio:13.1f}x" if r.cpu_ratio else f"{'-':>14}"
        print(
            f"{r.bits:>5} {r.batch:>5} {r.split.step_s:12.3f} {r.split_he.step_s:15.3f} "
            f"{r.engine.times.step_s:9.3f} {n_s} {r.phe_s:9.2f} {r.phe_s / r.engine.times.step_s:9.1f}x {n_x} "
            f"{cpu_x} {r.phe_s / r.split_he.step_s:11.1f}x {_fmt_bytes(r.split.bytes_per_step):>13} "
            f"{_fmt_bytes(r.split_he.bytes_per_step):>15} {r.load:5.1f}"
        )
    pool = (
        f"\n  engine {nw}: the same with a pool of {workers} crypto worker processes." if workers > 1 else ""
    )
    print(f"""
split, split-he: distributed runs (4 processes over gRPC on loopback, 1 torch thread and 1 crypto worker
  each); engine: the same split-he run with every role in this process (loopback bridge), 1 crypto worker.{pool}
  Step times: the coordinator's, mean over training steps 2..{steps} (step 1 also builds every party's
  encryption table; key generation happens before step 1); bytes: every party message of a step.
phe: python-paillier {phe.__version__} (gmpy2), one EncryptedNumber per value: the per-value operations
  the engine counted in the real step (encryptions, additions, masks, products by multiplier size,
  re-randomisations, decryptions; the gradient: one value per parameter), each timed with phe (median of
  5 rounds) under a key of the same size with the same fixed point (logits and g 2^-{FRAC_BITS}, multipliers
  {MULTIPLIER_BITS} significant bits or exact, ReLU-inactive units skipped), summed.
  The engine encrypts logits packed, packs [[g]] for the last layer's weight gradient and decrypts packed
  masked values (phe objects cannot be packed).
phe/engine: the engine's speed-up on the same step (wall time); cpu phe/engine: the same with 1 worker in CPU
  seconds of this process (the engine's: every role's, between the ends of steps 1 and N), which other jobs
  on the machine barely change; phe/split-he: phe step against the distributed step.
load: 1-minute load average of this machine after the row's in-process runs.""")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vflnet bench he-step", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048], help="Paillier key sizes")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128], help="batch sizes")
    parser.add_argument(
        "--steps", type=int, default=3, help="training steps per run (the first is not timed)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="crypto worker processes of the second engine run (1: no second run)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, argv, smoke={"bits": [512], "batch": [8], "steps": 2, "workers": 1})
    if args.steps < 2 or min(args.batch) < 1 or args.workers < 1 or min(args.bits) < 256:
        parser.error("--steps must be >= 2, --batch and --workers >= 1, --bits >= 256")

    print(
        f"paper 004 digits MLP: 2 passive parties x (32 -> {HIDDEN} -> ReLU -> {LOGITS}), sum, top none; "
        f"{args.steps} steps per run",
        flush=True,
    )
    split = {}
    for batch in args.batch:
        split[batch] = run_distributed("split", 0, batch, args.steps, args.seed)
        print(f"split batch {batch}: {split[batch].step_s:.3f} s/step", flush=True)
    rows: list[Row] = []
    for bits in args.bits:
        public_key, private_key = generate_keypair(bits, allow_insecure=bits < 1024)
        pk, sk = public_key.to_phe(), private_key.to_phe()
        for batch in args.batch:
            dist = run_distributed("split-he", bits, batch, args.steps, args.seed)
            print(f"{bits} bits batch {batch}: split-he distributed {dist.step_s:.3f} s/step", flush=True)
            engine = run_engine(bits, batch, args.steps, args.seed)
            cpu = f" (cpu {engine.times.cpu_s:.3f})" if engine.times.cpu_s else ""
            print(f"  engine (loopback, 1 worker): {engine.times.step_s:.3f} s/step{cpu}", flush=True)
            engine_n = None
            if args.workers > 1:
                engine_n = run_engine(bits, batch, args.steps, args.seed, args.workers)
                print(
                    f"  engine (loopback, {args.workers} workers): {engine_n.times.step_s:.3f} s/step",
                    flush=True,
                )
            products = [key for counts in engine.counts.values() for key in counts.mul_bits]
            wall, cpu_costs = phe_costs(pk, sk, products)
            stages, cpu_stages = phe_stages(engine, "active", wall), phe_stages(engine, "active", cpu_costs)
            print(f"  {_counts_line(engine, 'active')}", flush=True)
            cells = ", ".join(f"{s} {v:.3f}" for s, v in stages.items())
            print(
                f"  phe: {sum(stages.values()):.2f} s/step ({cells}; cpu {sum(cpu_stages.values()):.2f})",
                flush=True,
            )
            load = os.getloadavg()[0]
            rows.append(Row(bits, batch, split[batch], dist, engine, engine_n, stages, cpu_stages, load))
    shutdown_pools()
    print()
    _print_table(rows, args.steps, args.workers)
    write_json(args.json, [r.figures() for r in rows], steps=args.steps, workers=args.workers)
    return 0
