"""`vflnet bench he-step`: the phe pipeline does the same step as the engine and as autograd."""

from __future__ import annotations

import warnings

import numpy as np

from vflnet.bench.he_step import STAGES, StepOutcome, autograd_grads, engine_step, make_inputs, phe_step
from vflnet.crypto import generate_keypair


def test_phe_and_engine_steps_decrypt_the_autograd_gradient():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 512-bit keys: tests only
        public_key, private_key = generate_keypair(512, allow_insecure=True)
    inputs = make_inputs(4, seed=1)
    expected = autograd_grads(inputs)
    engine = engine_step(inputs, public_key, private_key)
    reference = phe_step(inputs, public_key.to_phe(), private_key.to_phe())
    assert set(engine.seconds) == set(reference.seconds) == set(STAGES)
    assert len(engine.grads) == len(reference.grads) == len(expected) == 2
    for want, got_engine, got_phe in zip(expected, engine.grads, reference.grads, strict=True):
        assert set(got_engine) == set(got_phe) == set(want) == {"0.weight", "0.bias", "2.weight", "2.bias"}
        for name, value in want.items():
            assert np.abs(value).max() > 1e-3, name  # a gradient worth comparing
            # same fixed point and the same g: the two pipelines decrypt identical integers
            np.testing.assert_array_equal(got_phe[name], got_engine[name], err_msg=name)
            # g is encrypted with 20 fractional bits; autograd runs in float32
            np.testing.assert_allclose(got_engine[name], value, atol=2e-5, err_msg=name)


def test_phe_time_scales_only_the_batch_stages():
    outcome = StepOutcome([], {s: 1.0 for s in STAGES})
    # four batch stages x (32 / 8) + the gradient stage, whose size does not depend on the batch
    assert outcome.scaled(rows=8, batch=32) == 4 * 4 + 1
