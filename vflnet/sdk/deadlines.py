"""Step deadlines that scale with the work: a 4096-bit split-he step on a loaded machine is not dead.

Every party estimates the compute of its heaviest step (``PartySide.step_work_s``: plaintext FLOPs
of its model at the batch size; split-he: Paillier products, encryptions and decryptions at the key
size; secureboost: gh encryptions, histogram additions and decryptions) in seconds of the reference
core below, and sends it on admission (``JoinRequest.step_work_s``). The coordinator sets

    step deadline = transport.rpc_timeout_s + transport.work_slack x (sum of the parties' estimates)

(the sum bounds any critical path through the parties' work) and hands it to every party in the
join reply (``JoinReply.step_deadline_s``): the coordinator's RunStep calls and every RPC and wait
within a step use it. ``rpc_timeout_s`` stays the floor for transport; ``work_slack`` is how much
slower than the reference core a loaded machine may run the work. Heartbeats, not this deadline,
tell a dead party from a slow one (vflnet/roles/heartbeat.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger("vflnet.deadlines")

# The reference core: one core of the 2-core development machine, unloaded (docs/performance.md,
# `vflnet bench paillier`, 2048-bit engine figures; torch on small float32 models).
PAILLIER_2048_S = {
    "encrypt": 1 / 6651,  # one value
    "add": 1 / 186964,  # ciphertext + ciphertext
    "product": 1 / 26837,  # ciphertext x plaintext within a matrix product (multi-exponentiation)
    "decrypt": 1 / 424,  # one ciphertext (CRT)
}
FLOPS = 2e9  # float32 multiply-adds per second on small models, conservatively
NUMPY_VALUE_S = 1e-7  # one value through a numpy pipeline of a few indexed operations
MAX_ESTIMATE_S = 86400.0  # a party's estimate above a day is refused on admission as implausible


def paillier_s(op: str, bits: int, count: float) -> float:
    """Seconds for ``count`` operations of kind ``op`` at modulus size ``bits``. Costs grow between the
    square and the cube of the modulus size (docs/performance.md: 1024 to 2048 bits is 3.5-5.3x): the
    cube, to err long."""
    return count * PAILLIER_2048_S[op] * (bits / 2048) ** 3


def forward_flops(module: Any, input_shape: Sequence[int] | None) -> float:
    """FLOPs of one sample's forward pass through ``module``: counted by torch on a copy on the meta
    device when the input shape is known (convolutions), else two per parameter (a linear stack)."""
    import copy

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    by_parameters = 2.0 * sum(p.numel() for p in module.parameters())
    if input_shape is None:
        return by_parameters
    try:  # two samples: batch norm in training mode needs more than one
        with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
            copy.deepcopy(module).to("meta")(torch.empty((2, *input_shape), device="meta"))
    except Exception as exc:  # a plug-in model that cannot run on meta tensors: the estimate is a bound
        log.warning(
            "cannot count the FLOPs of %s (%s): estimating from its parameters", type(module).__name__, exc
        )
        return by_parameters
    return counter.get_total_flops() / 2


def largest_batch(cfg: Any) -> int:
    """The most samples one step of the run carries (training, evaluation or prediction): only the
    phases the run has, as their batch sizes are read only then (docs/config.md)."""
    sizes = [cfg.train.batch_size]
    if cfg.train.eval_every > 0:
        sizes.append(cfg.train.eval_batch_size)
    if cfg.predict.set != "none":
        sizes.append(cfg.predict.batch_size)
    return max(sizes)


def training_s(flops_per_sample: float, batch: int) -> float:
    """A training step's forward and backward pass (about three forward passes) over ``batch`` samples."""
    return 3 * flops_per_sample * batch / (2 * FLOPS)


def step_deadline_s(rpc_timeout_s: float, work_slack: float, estimates: Mapping[str, float]) -> float:
    """The deadline of every RPC and wait within a step, from the parties' work estimates (by party)."""
    work = sum(estimates.values())  # each in [0, MAX_ESTIMATE_S]: checked on admission
    deadline = rpc_timeout_s + work_slack * work
    heaviest = max(estimates, key=lambda p: estimates[p], default="")
    log.info(
        "step deadline %.0f s: transport.rpc_timeout_s %.0f + work_slack %g x %.2f s of estimated work "
        "(heaviest: %s, %.2f s)",
        deadline,
        rpc_timeout_s,
        work_slack,
        work,
        heaviest or "-",
        estimates.get(heaviest, 0.0),
    )
    return deadline
