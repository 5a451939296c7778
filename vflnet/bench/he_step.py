"""`vflnet bench he-step`: seconds and bytes per training step of split-he against python-paillier.

The model is paper 004's MLP on digits: two passive parties each hold one 32-feature half, each
bottom is Linear(32, 32) - ReLU - Linear(32, 10), the logits are summed, the top model is the
identity, and the active party holds only the labels. For every key size and batch size it shows

  split      plaintext split learning, distributed (real processes over gRPC);
  split-he   paper 004 Algorithm 1 with the vflnet engine, distributed the same way;
  engine     the per-step cryptographic work of split-he in one process with the vflnet engine;
  phe        the same work, stage for stage, with python-paillier (gmpy2) EncryptedNumber objects in
             Python loops.

`engine` and `phe` run the same stages on the same plaintexts and keys, so their ratio is the
engine's speed-up; both run every party's work one after another in one process, while the
distributed step runs the two passive parties in parallel processes. phe is slow, so it runs on a
subset of the batch rows: its batch stages are linear in the batch size and are scaled up, and the
gradient stage (mask and decrypt the flattened parameter gradient, whose size does not depend on the
batch) is measured at full size.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import json
import operator
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import phe
import torch
import yaml
from torch import nn
from torch.nn import functional as F

from vflnet.config import HEConfig, ModelConfig
from vflnet.crypto import (
    CipherArray,
    PrivateKey,
    PublicKey,
    generate_keypair,
)
from vflnet.crypto.masking import HEADROOM_BITS, STATISTICAL_BITS, mask, unmask
from vflnet.crypto.parallel import shutdown_pools
from vflnet.data.datasets import load_dataset
from vflnet.models.zoo import build_bottom
from vflnet.protocols.he_backprop import (
    MULTIPLIER_BITS,
    ForwardCache,
    forward_with_cache,
    multiplier_frac_bits,
    packed_param_grads,
)
from vflnet.protocols.split_he import logit_slots
from vflnet.runner.local import run_local

FRAC_BITS = HEConfig().frac_bits  # fixed-point scale of the encrypted logits and of [[g]]
PHE_VALUE_BITS = 32  # phe tracks no bounds: masks assume |value| < 2^32 (the engine uses its tracked bound)
HIDDEN, LOGITS, HALF = 32, 10, 32
BATCH_STAGES = ("encrypt logits", "aggregate", "encrypt g", "backprop")  # work linear in the batch size
GRADIENT_STAGE = "gradient"  # mask + decrypt the flattened parameter gradient: independent of the batch
STAGES = (*BATCH_STAGES, GRADIENT_STAGE)

# The paper 004 digits MLP as a run config; the benchmark fills in protocol, key size, batch and steps.
# A small test set keeps the closing (untimed) evaluation short.
PAPER_004_DIGITS: dict[str, Any] = {
    "run": {"id": "bench-he-step", "seed": 0},
    "protocol": {"kind": "split-he", "aggregation": "sum"},
    "data": {"dataset": "digits", "test_fraction": 0.02},
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
        "eval_every": 1000,
        "optimizer": {"kind": "sgd", "lr": 0.1},
    },
    "transport": {"rpc_timeout_s": 600, "join_timeout_s": 300},
}


# ----------------------------------------------------------------------------- one step's inputs
@dataclass
class StepInputs:
    """What one training step of the two passive parties and the active party starts from."""

    bottoms: list[nn.Sequential]
    xs: list[np.ndarray]  # float32 [B, 32] per passive party
    y: np.ndarray  # int64 [B]

    @property
    def batch(self) -> int:
        return len(self.y)


def make_inputs(batch: int, seed: int = 0) -> StepInputs:
    """The first `batch` digits split into two 32-feature halves, and freshly seeded bottoms."""
    data = load_dataset("digits")
    x = data.features.reshape(len(data.labels), -1)[:batch].astype(np.float32)
    torch.manual_seed(seed)
    spec = ModelConfig(kind="mlp", hidden=[HIDDEN], out=LOGITS)
    bottoms = [build_bottom(spec, (HALF,)) for _ in range(2)]
    assert all(isinstance(b, nn.Sequential) for b in bottoms)
    return StepInputs(bottoms, [x[:, :HALF].copy(), x[:, HALF:].copy()], data.labels[:batch].astype(np.int64))  # type: ignore[arg-type]


def autograd_grads(inputs: StepInputs) -> list[dict[str, np.ndarray]]:
    """Plaintext reference: every bottom's parameter gradient of the mean cross-entropy of the summed logits."""
    for bottom in inputs.bottoms:
        bottom.zero_grad()
    logits = sum(b(torch.from_numpy(x)) for b, x in zip(inputs.bottoms, inputs.xs, strict=True))
    assert isinstance(logits, torch.Tensor)
    F.cross_entropy(logits, torch.from_numpy(inputs.y)).backward()
    out = []
    for bottom in inputs.bottoms:
        out.append(
            {n: p.grad.double().numpy().copy() for n, p in bottom.named_parameters() if p.grad is not None}
        )
        bottom.zero_grad()
    return out


def loss_gradient(aggregate: np.ndarray, y: np.ndarray) -> np.ndarray:
    """g = dL/dH of the mean cross-entropy, as the active party computes it (float32 logits)."""
    h = torch.from_numpy(aggregate.astype(np.float32)).requires_grad_(True)
    F.cross_entropy(h, torch.from_numpy(y)).backward()
    assert h.grad is not None
    return h.grad.double().numpy()


@dataclass
class StepOutcome:
    """Decrypted parameter gradients per passive party and seconds spent per stage.

    `seconds` is wall time; `cpu_seconds` is this process's CPU time, which other processes on a
    loaded machine barely change (it leaves out the engine's worker processes, if any).
    """

    grads: list[dict[str, np.ndarray]]
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + time.process_time() - cpu_start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu_seconds.values())

    def scaled(self, rows: int, batch: int, cpu: bool = False) -> float:
        """Step seconds at `batch` rows from a run on `rows`: batch stages scale linearly, the gradient stage does not."""
        seconds = self.cpu_seconds if cpu else self.seconds
        linear = sum(seconds.get(s, 0.0) for s in BATCH_STAGES)
        return linear * batch / rows + seconds.get(GRADIENT_STAGE, 0.0)


# ------------------------------------------------------------------------------- vflnet engine
def _sendable(ca: CipherArray, workers: int) -> CipherArray:
    """What `cipher_to_proto` does before anything leaves a party: re-randomise computed ciphertexts."""
    return ca if ca.fresh else ca.rerandomize(workers)


def engine_step(
    inputs: StepInputs, public_key: PublicKey, private_key: PrivateKey, workers: int = 1
) -> StepOutcome:
    """One split-he training step (protocols/split_he.py) in one process with the vflnet engine."""
    out = StepOutcome([])
    caches: list[ForwardCache] = []
    received: list[CipherArray] = []
    with out.stage("encrypt logits"):
        for bottom, x in zip(inputs.bottoms, inputs.xs, strict=True):
            logits, cache = forward_with_cache(bottom, torch.from_numpy(x))
            caches.append(cache)
            values = logits.double().numpy()
            slots = logit_slots(public_key, FRAC_BITS, values.shape[-1])
            received.append(public_key.encrypt(values, FRAC_BITS, slots=slots, workers=workers))
    with out.stage("aggregate"):
        total = functools.reduce(operator.add, received)
        masked, r = mask(total, workers=workers)
        aggregate = unmask(
            private_key.decrypt_encoded(_sendable(masked, workers), workers), r, masked.frac_bits
        )
    with out.stage("encrypt g"):
        grad = public_key.encrypt(loss_gradient(aggregate, inputs.y), FRAC_BITS, workers=workers)
    for bottom, cache in zip(inputs.bottoms, caches, strict=True):
        with out.stage("backprop"):
            packed, layout = packed_param_grads(bottom, cache, grad, HEADROOM_BITS, workers)
        with out.stage(GRADIENT_STAGE):
            masked, r = mask(packed, workers=workers)
            ints = private_key.decrypt_encoded(_sendable(masked, workers), workers)
            out.grads.append(layout.split(unmask(ints, r, masked.frac_bits)))
    return out


def _split(values: np.ndarray, bottom: nn.Module) -> dict[str, np.ndarray]:
    grads, offset = {}, 0
    for name, p in bottom.named_parameters():
        grads[name] = values[offset : offset + p.numel()].reshape(p.shape)
        offset += p.numel()
    return grads


# ------------------------------------------------------------------------------ python-paillier
def _phe_encode(pk: phe.PaillierPublicKey, values: np.ndarray, frac_bits: int) -> np.ndarray:
    """EncodedNumbers with the engine's fixed point: round(v * 2^frac_bits) (integers: frac_bits 0).

    The exponent holds -frac_bits in base 2, not phe's base 16: the stages below only add exponents
    (products) or combine equal ones (sums, masks), and the bench decodes values itself, so any
    fractional bit count works and phe multiplies by exactly the engine's integers.
    """
    ints = (
        values.astype(np.int64)
        if values.dtype.kind in "iub"
        else np.rint(np.ldexp(values.astype(np.float64), frac_bits))
    )
    out = np.empty(values.shape, dtype=object)
    out.reshape(-1)[:] = [phe.EncodedNumber(pk, int(v) % pk.n, -frac_bits) for v in ints.reshape(-1)]
    return out


def _phe_encrypt(pk: phe.PaillierPublicKey, values: np.ndarray, frac_bits: int) -> np.ndarray:
    out = np.empty(values.shape, dtype=object)
    out.reshape(-1)[:] = [pk.encrypt(e) for e in _phe_encode(pk, values, frac_bits).reshape(-1)]
    return out


def _phe_sum(terms: Any) -> phe.EncryptedNumber:
    return functools.reduce(operator.add, terms)


def _phe_decrypt_masked(pk: phe.PaillierPublicKey, sk: phe.PaillierPrivateKey, enc: np.ndarray) -> np.ndarray:
    """Mask every value, obfuscate it for the wire, have the key holder decrypt it, unmask: float64."""
    out = np.empty(enc.shape, dtype=np.float64)
    flat = out.reshape(-1)
    for i, c in enumerate(enc.reshape(-1)):
        span = 1 << (PHE_VALUE_BITS - c.exponent + STATISTICAL_BITS)
        r = secrets.randbelow(2 * span + 1) - span
        masked = c + phe.EncodedNumber(pk, r % pk.n, c.exponent)
        sent = phe.EncryptedNumber(pk, masked.ciphertext(be_secure=True), masked.exponent)
        seen = sk.decrypt_encoded(sent).encoding
        signed = seen - pk.n if seen > pk.n // 2 else seen
        flat[i] = (signed - r) / (1 << -c.exponent)
    return out


def _phe_param_grads(
    pk: phe.PaillierPublicKey, module: nn.Sequential, cache: ForwardCache, grad: np.ndarray
) -> dict[str, np.ndarray]:
    """he_backprop.encrypted_param_grads with one phe EncryptedNumber per value and Python loops."""
    linears = [(name, layer) for name, layer in module.named_children() if isinstance(layer, nn.Linear)]
    out: dict[str, np.ndarray] = {}
    delta = grad  # [B, out] EncryptedNumbers
    for index in range(len(linears) - 1, -1, -1):
        name, layer = linears[index]
        a = _phe_encode(pk, cache.inputs[index], multiplier_frac_bits(cache.inputs[index]))  # [B, in]
        batch, width = delta.shape
        weight = np.empty((width, a.shape[1]), dtype=object)
        for o in range(width):
            for i in range(a.shape[1]):
                weight[o, i] = _phe_sum(delta[b, o] * a[b, i] for b in range(batch))
        out[f"{name}.weight"] = weight
        if layer.bias is not None:
            bias = np.empty(width, dtype=object)
            bias[:] = [_phe_sum(delta[:, o]) for o in range(width)]
            out[f"{name}.bias"] = bias
        if index > 0:
            weights = layer.weight.detach().double().numpy()
            w = _phe_encode(pk, weights, multiplier_frac_bits(weights))  # [out, in]
            derivative = cache.derivatives[index]
            relu = (
                derivative is not None and derivative.dtype == np.bool_
            )  # skip inactive units, as the engine does
            zero = phe.EncryptedNumber(
                pk, 1, delta[0, 0].exponent + w[0, 0].exponent
            )  # Enc(0), no randomness
            back = np.empty((batch, w.shape[1]), dtype=object)
            for b in range(batch):
                for i in range(w.shape[1]):
                    active = not relu or derivative[b, i]
                    back[b, i] = _phe_sum(delta[b, o] * w[o, i] for o in range(width)) if active else zero
            if derivative is not None and not relu:
                d = _phe_encode(pk, derivative, multiplier_frac_bits(derivative))
                back.reshape(-1)[:] = [c * e for c, e in zip(back.reshape(-1), d.reshape(-1), strict=True)]
            delta = back
    return {name: out[name] for name, _ in module.named_parameters()}


def phe_step(inputs: StepInputs, pk: phe.PaillierPublicKey, sk: phe.PaillierPrivateKey) -> StepOutcome:
    """`engine_step`, stage for stage, with python-paillier objects."""
    out = StepOutcome([])
    caches: list[ForwardCache] = []
    received: list[np.ndarray] = []
    with out.stage("encrypt logits"):
        for bottom, x in zip(inputs.bottoms, inputs.xs, strict=True):
            logits, cache = forward_with_cache(bottom, torch.from_numpy(x))
            caches.append(cache)
            received.append(_phe_encrypt(pk, logits.double().numpy(), FRAC_BITS))
    with out.stage("aggregate"):
        total = np.empty(received[0].shape, dtype=object)
        total.reshape(-1)[:] = [_phe_sum(cs) for cs in zip(*(r.reshape(-1) for r in received), strict=True)]
        aggregate = _phe_decrypt_masked(pk, sk, total)
    with out.stage("encrypt g"):
        grad = _phe_encrypt(pk, loss_gradient(aggregate, inputs.y), FRAC_BITS)
    for bottom, cache in zip(inputs.bottoms, caches, strict=True):
        with out.stage("backprop"):
            enc = _phe_param_grads(pk, bottom, cache, grad)
        with out.stage(GRADIENT_STAGE):
            flat = np.concatenate([g.reshape(-1) for g in enc.values()])
            values = _phe_decrypt_masked(pk, sk, flat)
        out.grads.append(_split(values, bottom))
    return out


# --------------------------------------------------------------------------------- distributed
@dataclass
class Distributed:
    step_s: float  # mean step wall time, first step excluded
    bytes_per_step: float
    timed_steps: int


def run_distributed(kind: str, bits: int, batch: int, steps: int, seed: int = 0) -> Distributed:
    """Train `steps` steps on a local cluster of real processes and read the coordinator's metrics.

    Bytes per step are the run's total over all training steps divided by their number: the active
    party meters its gradient replies on the RPC thread, so a reply can land in the next step's report.
    """
    cfg = copy.deepcopy(PAPER_004_DIGITS)
    cfg["run"]["seed"] = seed
    cfg["protocol"]["kind"] = kind
    if kind == "split-he":
        cfg["protocol"]["he"] = {"key_bits": bits, "frac_bits": FRAC_BITS}
    cfg["train"].update(batch_size=batch, max_steps=steps)
    with tempfile.TemporaryDirectory(prefix="vflnet-he-step-") as tmp:
        cfg["run"]["dir"] = tmp
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run_dir = Path(tmp) / "run"
        chatter = io.StringIO()  # the launcher's banner and run summary; shown only if the run fails
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            status = run_local(path, run_dir=run_dir, progress=False)
        if status != 0:
            raise RuntimeError(
                f"distributed {kind} run failed ({bits} bits, batch {batch}):\n{chatter.getvalue()}"
            )
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "step"]
    if len(train) != steps:
        raise RuntimeError(f"expected {steps} training steps in metrics.jsonl, found {len(train)}")
    timed = train[1:]  # the first step also builds each party's encryption table
    total_bytes = sum(sum(r["bytes_sent"].values()) for r in train)
    return Distributed(statistics.mean(r["step_time_s"] for r in timed), total_bytes / len(train), len(timed))


# ------------------------------------------------------------------------------------- report
@dataclass
class Row:
    bits: int
    batch: int
    split: Distributed
    split_he: Distributed
    engine: StepOutcome  # 1 crypto worker
    engine_n: StepOutcome | None  # `workers` crypto workers (None when workers == 1)
    phe: StepOutcome
    phe_rows: int
    load: float  # 1-minute load average when the row's in-process runs ended

    @property
    def phe_s(self) -> float:
        return self.phe.scaled(self.phe_rows, self.batch)

    @property
    def cpu_ratio(self) -> float:
        """phe / engine (1 worker) in CPU seconds of the measuring process."""
        return self.phe.scaled(self.phe_rows, self.batch, cpu=True) / self.engine.cpu_total


def _stage_line(label: str, outcome: StepOutcome) -> str:
    cells = " | ".join(f"{outcome.seconds.get(s, 0.0):.3f}" for s in STAGES)
    return f"  {label}: {cells} | {outcome.total:.3f} (cpu {outcome.cpu_total:.3f})"


def _fmt_bytes(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.2f} MiB"


def _print_table(rows: list[Row], steps: int, workers: int) -> None:
    nw = f"{workers}w"
    header = (
        f"{'bits':>5} {'batch':>5} {'split s/step':>12} {'split-he s/step':>15} {'engine s':>9} {'engine ' + nw + ' s':>12} "
        f"{'phe s':>9} {'phe':>8} {'phe/engine':>10} {'phe/engine ' + nw:>13} {'cpu phe/engine':>14} {'phe/split-he':>12} "
        f"{'split B/step':>13} {'split-he B/step':>15} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        how = "measured" if r.phe_rows == r.batch else f"scaled {r.phe_rows}"
        n_s = f"{r.engine_n.total:12.3f}" if r.engine_n else f"{'-':>12}"
        n_x = f"{r.phe_s / r.engine_n.total:12.1f}x" if r.engine_n else f"{'-':>13}"
        print(
            f"{r.bits:>5} {r.batch:>5} {r.split.step_s:12.3f} {r.split_he.step_s:15.3f} {r.engine.total:9.3f} {n_s} "
            f"{r.phe_s:9.2f} {how:>8} {r.phe_s / r.engine.total:9.1f}x {n_x} {r.cpu_ratio:13.1f}x {r.phe_s / r.split_he.step_s:11.1f}x "
            f"{_fmt_bytes(r.split.bytes_per_step):>13} {_fmt_bytes(r.split_he.bytes_per_step):>15} {r.load:5.1f}"
        )
    print(f"""
split, split-he: distributed runs (4 processes over gRPC on loopback, 1 torch thread and 1 crypto worker
  each), mean coordinator-timed step wall time over training steps 2..{steps} (step 1 also builds every
  party's encryption table; key generation happens before step 1), bytes: every party message of a step.
engine, phe: the same split-he step's cryptographic work in one process, both passive parties one after the
  other (the distributed step runs them in parallel), measured back to back for every row. engine: 1 crypto
  worker; engine {nw}: a pool of {workers} worker processes (warmed up before timing). phe: python-paillier
  {phe.__version__} objects (gmpy2) in one process, fixed point as the engine's (logits and g 2^-{FRAC_BITS},
  multipliers {MULTIPLIER_BITS} significant bits or exact, ReLU-inactive units skipped), every value encrypted,
  masked, obfuscated and decrypted on its own. The engine encrypts logits packed, packs [[g]] for the last
  layer's weight gradient and decrypts packed masked values (phe objects cannot be packed).
"scaled k": phe ran on the first k rows of the batch; its batch stages ({", ".join(BATCH_STAGES)})
  were multiplied by batch/k and its gradient stage (mask + decrypt the {_n_params()} parameter
  gradients of each passive party, independent of the batch) was measured at full size.
phe/engine: in-process speed-up of the engine (wall time); cpu phe/engine: the same for 1 worker in CPU
  seconds of the measuring process, which load from other processes on the machine barely changes;
  phe/split-he: phe step against the distributed step.
load: 1-minute load average of this machine after the row's in-process runs.""")


def _n_params() -> int:
    return HALF * HIDDEN + HIDDEN + HIDDEN * LOGITS + LOGITS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vflnet bench he-step", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048], help="Paillier key sizes")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128], help="batch sizes")
    parser.add_argument(
        "--steps", type=int, default=3, help="training steps per distributed run (the first is not timed)"
    )
    parser.add_argument(
        "--phe-rows", type=int, default=8, help="batch rows phe runs on (scaled up to the batch)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="crypto worker processes of the second engine run (1: no second run)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.phe_rows < 1 or min(args.batch) < 1 or args.workers < 1:
        parser.error("--steps must be >= 2, --phe-rows, --batch and --workers >= 1")

    print(
        f"paper 004 digits MLP: 2 passive parties x (32 -> {HIDDEN} -> ReLU -> {LOGITS}), sum, top none; "
        f"{args.steps} distributed steps per run, phe on <= {args.phe_rows} rows",
        flush=True,
    )
    print(f"in-process stages (s): {' | '.join(STAGES)} | total", flush=True)
    split = {}
    for batch in args.batch:
        split[batch] = run_distributed("split", 0, batch, args.steps, args.seed)
        print(f"split batch {batch}: {split[batch].step_s:.3f} s/step", flush=True)
    rows: list[Row] = []
    for bits in args.bits:
        public_key, private_key = generate_keypair(bits)
        public_key.randomness  # noqa: B018 - build the engine's fixed-base table outside the timing
        if args.workers > 1:  # start the pool and build every worker's table outside the timing
            engine_step(make_inputs(2, args.seed), public_key, private_key, args.workers)
        pk, sk = public_key.to_phe(), private_key.to_phe()
        for batch in args.batch:
            dist = run_distributed("split-he", bits, batch, args.steps, args.seed)
            print(f"{bits} bits batch {batch}: split-he distributed {dist.step_s:.3f} s/step", flush=True)
            inputs = make_inputs(batch, args.seed)
            engine = engine_step(inputs, public_key, private_key)
            print(_stage_line(f"engine {bits} bits, {batch} rows", engine), flush=True)
            engine_n = None
            if args.workers > 1:
                engine_n = engine_step(inputs, public_key, private_key, args.workers)
                print(_stage_line(f"engine {args.workers} workers", engine_n), flush=True)
            n = min(args.phe_rows, batch)
            reference = phe_step(make_inputs(n, args.seed), pk, sk)
            print(_stage_line(f"phe {bits} bits, {n} rows", reference), flush=True)
            rows.append(
                Row(bits, batch, split[batch], dist, engine, engine_n, reference, n, os.getloadavg()[0])
            )
    shutdown_pools()
    print()
    _print_table(rows, args.steps, args.workers)
    return 0
