"""The split-he speed paths: multiplier encoding, ReLU-masked C @ P, masks on packed arrays, and the
packed parameter gradient, each checked against the plain engine path or autograd."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from vflnet.crypto import PaillierOverflowError, generate_keypair
from vflnet.crypto.masking import HEADROOM_BITS, mask, unmask
from vflnet.protocols.he_backprop import (
    MULTIPLIER_BITS,
    encrypted_param_grads,
    forward_with_cache,
    multiplier_frac_bits,
    packed_param_grads,
)
from vflnet.protocols.split_he import logit_slots

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # 512-bit keys: tests only
    PK, SK = generate_keypair(512, allow_insecure=True)


def test_multiplier_frac_bits_is_exact_when_it_can_be_and_float32_precise_otherwise():
    assert multiplier_frac_bits(np.array([[0, 1], [1, 0]], dtype=bool)) == 0
    assert multiplier_frac_bits(np.arange(17) / 16.0) == 4  # digits pixels: exact with 4 bits
    assert multiplier_frac_bits(np.array([3.0, -12.0])) == 0
    assert multiplier_frac_bits(np.zeros(3)) == 0
    w = np.random.default_rng(0).normal(0, 0.2, (10, 32)).astype(np.float32).astype(np.float64)
    frac = multiplier_frac_bits(w)
    ints = np.rint(np.ldexp(w, frac))
    assert np.abs(ints).max() < 2**MULTIPLIER_BITS  # the exponent length the products pay for
    assert np.abs(np.ldexp(ints, -frac) - w).max() <= np.abs(w).max() * 2.0**-MULTIPLIER_BITS


def test_masked_matmul_is_the_product_times_the_mask():
    rng = np.random.default_rng(1)
    c = PK.encrypt(rng.normal(size=(6, 4)), 16)
    p = rng.normal(size=(4, 5))  # negative multipliers too
    keep = rng.random((6, 5)) < 0.5
    full = SK.decrypt_encoded(c.matmul_plain(p, 20))
    masked = SK.decrypt_encoded(c.matmul_plain(p, 20, where=keep))
    assert np.array_equal(masked, np.where(keep, full, 0))
    with pytest.raises(ValueError, match="where has shape"):
        c.matmul_plain(p, 20, where=keep.T)


def test_masking_a_packed_array_needs_headroom_in_its_slots():
    values = np.array([[0.5, -1.25, 3.0], [2.0, 0.0, -7.5]])
    roomy = PK.encrypt(values, 8).pack(headroom_bits=HEADROOM_BITS)
    masked, r = mask(roomy)
    assert masked.packed and masked.data.shape == roomy.data.shape  # masked in place, not repacked
    seen = SK.decrypt_encoded(masked)
    assert np.all(seen != SK.decrypt_encoded(roomy))
    np.testing.assert_array_equal(unmask(seen, r, masked.frac_bits), values)
    tight = PK.encrypt(np.arange(40.0).reshape(1, 40), 8).pack()  # slots just wide enough for the values
    assert tight.slot_width < tight.value_bits + HEADROOM_BITS
    with pytest.raises(PaillierOverflowError):
        mask(tight)


def test_packing_fewer_values_than_slots_keeps_them():
    values = np.array([[1.5, -2.0, 3.25], [0.0, 4.0, -5.5]])
    packed = PK.encrypt(values, 4).pack(slots=5)
    assert packed.data.shape == (2, 1)
    np.testing.assert_array_equal(SK.decrypt(packed), values)


@pytest.mark.parametrize(
    ("layers", "out"),
    [
        ([nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)], 3),  # fewer logits than slots: padded rows
        (
            [nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 10)],
            10,
        ),  # more logits than slots
        ([nn.Linear(6, 10, bias=False)], 10),  # nothing but the packed weight
    ],
)
def test_packed_gradient_decrypts_to_the_unpacked_one_and_to_autograd(layers, out):
    torch.manual_seed(0)
    model = nn.Sequential(*layers)
    x = torch.randn(9, 6)
    g = torch.randn(9, out) / 9
    _, cache = forward_with_cache(model, x)
    grad = PK.encrypt(g.double().numpy(), 24)
    packed, layout = packed_param_grads(model, cache, grad, HEADROOM_BITS)
    assert packed.packed
    masked, r = mask(packed)
    got = layout.split(unmask(SK.decrypt_encoded(masked), r, masked.frac_bits))
    unpacked = encrypted_param_grads(model, cache, grad)
    model(x).backward(g)
    for name, p in model.named_parameters():
        # the same integers (scaled to one frac_bits), so the same floats
        np.testing.assert_array_equal(got[name], SK.decrypt(unpacked[name]), err_msg=name)
        np.testing.assert_allclose(got[name], p.grad.double().numpy(), atol=2e-6, err_msg=name)
    assert masked.data.size < sum(p.numel() for p in model.parameters())  # fewer ciphertexts to decrypt


def test_packed_logits_of_parties_add_and_mask_slot_by_slot():
    rng = np.random.default_rng(2)
    logits = [rng.normal(0, 3, (4, 10)), rng.normal(0, 300, (4, 10))]  # different bounds, same layout
    slots = logit_slots(PK, 20, 10)
    received = [PK.encrypt(h, 20, slots=slots) for h in logits]
    assert slots > 1 and all(c.slots == slots and c.data.shape == (4, 2) for c in received)
    masked, r = mask(received[0] + received[1])
    np.testing.assert_allclose(unmask(SK.decrypt_encoded(masked), r, 20), logits[0] + logits[1], atol=2**-19)
    huge = PK.encrypt(np.full((1, 10), 2.0**40), 20, slots=slots)  # far beyond the layout's room
    with pytest.raises(PaillierOverflowError):  # refused before anything wraps
        mask(huge)
