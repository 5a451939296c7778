"""`vflnet bench he-step`: the engine column is the real split-he step, and phe is costed on the
per-value operations counted in that step (vflnet.crypto.opcount)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from vflnet.crypto import generate_keypair
from vflnet.crypto.opcount import OpCounts
from vflnet.tools.bench.he_step import (
    HIDDEN,
    LOGITS,
    PASSIVES,
    STAGES,
    PheCosts,
    phe_costs,
    phe_stages,
    run_engine,
)

FEATURES, BITS = 32, 512  # 512-bit keys: tests only


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("he-step")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            (kind, batch): (
                run_engine(BITS, batch, 2, seed=1, kind=kind, run_dir=root / f"{kind}-{batch}"),
                root,
            )
            for kind, batch in (("split", 8), ("split-he", 8), ("split-he", 16))
        }


def _params(run_dir: Path, party: str) -> dict[str, torch.Tensor]:
    modules = torch.load(run_dir / "checkpoints" / f"{party}.pt")["modules"]
    return {f"{m}.{n}": v for m, state in modules.items() for n, v in state.items()}


def test_engine_column_runs_the_real_split_he_step_and_decrypts_the_autograd_gradient(runs) -> None:
    """Two SGD steps (lr 0.1) of the split-he protocol over the loopback bridge end where plaintext split
    learning ends: the passive parties applied the decrypted autograd gradients."""
    run, root = runs[("split-he", 8)]
    assert run.times.timed_steps == 1 and run.times.step_s > 0 and run.times.cpu_s is not None
    for party in PASSIVES:
        he, plain = _params(root / "split-he-8", party), _params(root / "split-8", party)
        assert (
            he.keys()
            == plain.keys()
            == {"bottom.0.weight", "bottom.0.bias", "bottom.2.weight", "bottom.2.bias"}
        )
        for name, value in plain.items():
            # g is encrypted with 20 fractional bits; autograd runs in float32
            np.testing.assert_allclose(he[name].numpy(), value.numpy(), atol=1e-5, err_msg=f"{party} {name}")
        assert any(not torch.equal(he[n], plain[n]) for n in he)  # through the fixed point, not plaintext


def test_counted_operations_are_the_per_value_work_of_algorithm_1(runs) -> None:
    """Per step, B = 8, two passive parties, L = 10 logits, hidden H = 32, F = 32 features."""
    run, _ = runs[("split-he", 8)]
    b, h, f, L = 8, HIDDEN, FEATURES, LOGITS
    active, coordinator = run.counts["active"], run.counts["coordinator"]
    assert dict(active.ops) == {"add": b * L, "add_plain": b * L, "obfuscate": b * L, "encrypt": b * L}
    masked = active["add_plain"]
    for party in PASSIVES:
        p = run.counts[party]
        assert p["encrypt"] == b * L and run.n_params[party] == h * f + h + L * h + L
        # backprop: h^T [[g]] and [[delta]]^T x in full, [[g]] @ W2 on the ReLU-active units only
        kept = (p["mul"] - b * L * h - b * h * f) / L
        assert 0 < kept <= b * h
        assert p["add"] == pytest.approx(
            L * h * (b - 1) + L * (b - 1) + kept * (L - 1) + h * f * (b - 1) + h * (b - 1)
        )
        assert sum(p.mul_bits.values()) == p["mul"]
        # its gradient: masked and re-randomised in the packed layout (>= one slot per parameter)
        assert p["add_plain"] == p["obfuscate"] >= run.n_params[party]
        masked += p["add_plain"]
    assert dict(coordinator.ops) == {"decrypt": masked}


def test_only_the_batch_work_scales_with_the_batch(runs) -> None:
    small, large = runs[("split-he", 8)][0], runs[("split-he", 16)][0]
    for party in ("active", *PASSIVES):
        assert large.counts[party]["encrypt"] == 2 * small.counts[party]["encrypt"]
    for party in PASSIVES:  # the gradient: one value per parameter, whatever the batch
        assert large.counts[party]["add_plain"] == small.counts[party]["add_plain"]
        assert large.n_params[party] == small.n_params[party]


def test_phe_costs_the_counted_work_stage_by_stage(runs) -> None:
    run, _ = runs[("split-he", 8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        public_key, private_key = generate_keypair(BITS, allow_insecure=True)
    products = {key for c in run.counts.values() for key in c.mul_bits}
    costs, cpu = phe_costs(public_key.to_phe(), private_key.to_phe(), products, samples=4)
    assert set(cpu.ops) == set(costs.ops) and set(cpu.mul) == set(costs.mul)
    assert (
        set(costs.ops) == {"encrypt", "add", "add_plain", "obfuscate", "decrypt"}
        and set(costs.mul) == products
    )
    assert all(v > 0 for v in [*costs.ops.values(), *costs.mul.values()])
    stages = phe_stages(run, "active", costs)
    assert set(stages) == set(STAGES) and all(v > 0 for v in stages.values())
    # unit costs: each stage is its counts; the gradient one value per parameter, not per packed slot
    unit = PheCosts(dict.fromkeys(costs.ops, 1.0), dict.fromkeys(products, 1.0))
    stages = phe_stages(run, "active", unit)
    p1, p2 = (run.counts[p] for p in PASSIVES)
    assert stages["encrypt logits"] == p1["encrypt"] + p2["encrypt"]
    assert stages["encrypt g"] == run.counts["active"]["encrypt"]
    assert stages["aggregate"] == 4 * 8 * LOGITS  # add, mask, re-randomise and decrypt each logit sum
    assert stages["backprop"] == pytest.approx(p1["add"] + p1["mul"] + p2["add"] + p2["mul"])
    assert stages["gradient"] == 3 * sum(run.n_params.values())


def test_op_counts_scale() -> None:
    counts = OpCounts()
    counts.ops.update(encrypt=4, mul=6)
    counts.mul_bits.update({(3, False): 6})
    half = counts.scaled(0.5)
    assert half["encrypt"] == 2 and half["mul"] == 3 and half.mul_bits[(3, False)] == 3
