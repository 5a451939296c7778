"""The vectorised engine against phe (the reference), value by value, and its overflow guards."""

from __future__ import annotations

import warnings

import numpy as np
import phe
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vflnet.crypto import (
    CipherArray,
    KeyMismatchError,
    PaillierOverflowError,
    concatenate,
    generate_keypair,
    shutdown_pools,
)
from vflnet.crypto.encoding import encode

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    PK, SK = generate_keypair(512, allow_insecure=True)
    OTHER_PK, OTHER_SK = generate_keypair(512, allow_insecure=True)
PHE_PK, PHE_SK = PK.to_phe(), SK.to_phe()
FRAC = 32
EPS = 2.0**-FRAC

SETTINGS = settings(
    max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
special = st.sampled_from([0.0, -0.0, 1e-9, -1e-9, 1.0, -1.0, 0.5, 123456.789, -654321.5, 3.0e-7])
# phe itself cannot encode sums that mix ~1e-190 with ~1; tiny values come from `special` instead
reals = st.one_of(
    special,
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False).filter(lambda v: v == 0 or abs(v) > 1e-12),
)
vectors = st.lists(reals, min_size=1, max_size=12).map(np.array)


def quantize(x: np.ndarray, frac: int = FRAC) -> np.ndarray:
    return np.ldexp(np.rint(np.ldexp(np.asarray(x, dtype=np.float64), frac)), -frac)


def phe_decrypt_all(numbers) -> np.ndarray:
    return np.array([PHE_SK.decrypt(x) for x in np.asarray(numbers, dtype=object).reshape(-1)])


@SETTINGS
@given(vectors, st.booleans())
def test_encrypt_decrypt_matches_phe(x: np.ndarray, pack: bool) -> None:
    ca = PK.encrypt(x, pack=pack)
    got = SK.decrypt(ca)
    assert np.array_equal(got, quantize(x))  # exact: round(x * 2^32) / 2^32
    ref = phe_decrypt_all([PHE_PK.encrypt(float(v)) for v in x])
    assert np.allclose(got, ref, rtol=0, atol=EPS)


@SETTINGS
@given(vectors, st.data(), st.booleans())
def test_cipher_plus_cipher_and_plaintext_match_phe(x: np.ndarray, data, pack: bool) -> None:
    y = np.array(data.draw(st.lists(reals, min_size=len(x), max_size=len(x))))
    p = np.array(data.draw(st.lists(reals, min_size=len(x), max_size=len(x))))
    cx, cy = PK.encrypt(x, pack=pack), PK.encrypt(y, pack=pack)
    got = SK.decrypt(cx + cy + p)
    ex = [PHE_PK.encrypt(float(v)) for v in x]
    ey = [PHE_PK.encrypt(float(v)) for v in y]
    ref = phe_decrypt_all([a + b + float(c) for a, b, c in zip(ex, ey, p, strict=True)])
    assert np.allclose(got, ref, rtol=0, atol=3 * EPS)
    # exact integer identity
    exact = encode(x, FRAC) + encode(y, FRAC) + encode(p, FRAC)
    assert list(SK.decrypt_encoded(cx + cy + p)) == list(exact)


@SETTINGS
@given(vectors, st.one_of(st.integers(-(2**40), 2**40), reals), st.booleans())
def test_scalar_product_matches_phe(x: np.ndarray, k, pack: bool) -> None:
    ca = PK.encrypt(x, pack=pack, headroom_bits=80)  # room for a 72-bit multiplier
    prod = ca * k
    frac_k = 0 if isinstance(k, int) else 32
    assert prod.frac_bits == FRAC + frac_k
    exact = [int(v) * int(encode(k, frac_k)) for v in encode(x, FRAC)]
    assert list(SK.decrypt_encoded(prod)) == exact
    ref = phe_decrypt_all([PHE_PK.encrypt(float(v)) * k for v in x])
    scale = np.abs(x) * 2.0**-32 + abs(float(k)) * EPS + 1e-12
    assert np.all(np.abs(SK.decrypt(prod) - ref) <= 2 * scale)


@SETTINGS
@given(
    st.lists(
        st.floats(-1e3, 1e3, allow_nan=False).filter(lambda v: v == 0 or abs(v) > 1e-12),
        min_size=50,
        max_size=300,
    ).map(np.array)
)
def test_sum_of_many_terms_matches_phe(x: np.ndarray) -> None:
    total = PK.encrypt(x).sum()
    assert total.shape == ()
    assert int(SK.decrypt_encoded(total)) == sum(int(v) for v in encode(x, FRAC))
    cols = np.stack([x, -x, x / 2], axis=1)
    packed_total = PK.encrypt(cols, pack=True, headroom_bits=12).sum(axis=0)
    assert packed_total.slots == 3
    assert list(SK.decrypt_encoded(packed_total)) == [sum(int(v) for v in encode(c, FRAC)) for c in cols.T]
    acc = PHE_PK.encrypt(0)
    for v in x:
        acc = acc + PHE_PK.encrypt(float(v))
    assert abs(float(SK.decrypt(total)) - PHE_SK.decrypt(acc)) <= len(x) * EPS


matrices = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))


def _random(shape, seed: int, scale: float = 10.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.normal(size=shape) * scale
    out[rng.random(size=shape) < 0.2] = 0.0
    return out


@SETTINGS
@given(matrices)
def test_cipher_matmul_plain_matches_phe(dims) -> None:
    m, k, j, seed = dims
    c, p = _random((m, k), seed), _random((k, j), seed + 1, scale=2.0)
    ca = PK.encrypt(c)
    out = ca @ p
    assert out.shape == (m, j) and out.frac_bits == 64
    ci, pi = encode(c, FRAC), encode(p, 32)
    assert np.array_equal(SK.decrypt_encoded(out), ci.dot(pi))
    enc = [[PHE_PK.encrypt(float(v)) for v in row] for row in c]
    ref = np.array([[PHE_SK.decrypt(sum((enc[a][t] * float(p[t, b]) for t in range(k)), PHE_PK.encrypt(0)))
                     for b in range(j)] for a in range(m)])  # fmt: skip
    assert np.allclose(SK.decrypt(out), ref, rtol=0, atol=1e-6)


@SETTINGS
@given(matrices, st.booleans())
def test_plain_matmul_cipher_matches_phe_packed_or_not(dims, pack: bool) -> None:
    m, k, j, seed = dims
    p, c = _random((m, k), seed, scale=2.0), _random((k, j), seed + 1)
    ca = PK.encrypt(c, pack=pack)
    out = p @ ca
    assert isinstance(out, CipherArray) and out.shape == (m, j) and out.slots == ca.slots
    assert np.array_equal(SK.decrypt_encoded(out), encode(p, 32).dot(encode(c, FRAC)))
    enc = [[PHE_PK.encrypt(float(v)) for v in row] for row in c]
    ref = np.array([[PHE_SK.decrypt(sum((enc[t][b] * float(p[a, t]) for t in range(k)), PHE_PK.encrypt(0)))
                     for b in range(j)] for a in range(m)])  # fmt: skip
    assert np.allclose(SK.decrypt(out), ref, rtol=0, atol=1e-6)


def test_vector_forms_of_matmul() -> None:
    rng = np.random.default_rng(3)
    v, w = rng.normal(size=5), rng.normal(size=(5, 3))
    cv = PK.encrypt(v)
    assert (cv @ w).shape == (3,) and np.allclose(SK.decrypt(cv @ w), v @ w, atol=1e-7)
    assert (w.T @ cv).shape == (3,) and np.allclose(SK.decrypt(w.T @ cv), w.T @ v, atol=1e-7)
    assert (cv @ w[:, 0]).shape == () and np.isclose(SK.decrypt(cv @ w[:, 0]), v @ w[:, 0], atol=1e-7)


def test_layerwise_backprop_shapes_of_the_he_protocol() -> None:
    """[[g]] (B x C) @ W2.T, masked by relu', then X.T @ [[delta]] — against plaintext numpy."""
    rng = np.random.default_rng(4)
    b, c, h, d = 6, 3, 4, 5
    g, w2, x = rng.normal(size=(b, c)) / b, rng.normal(size=(h, c)), rng.normal(size=(b, d))
    relu_mask = (rng.random(size=(b, h)) > 0.5).astype(np.int64)
    cg = PK.encrypt(g)
    delta = (cg @ w2.T) * relu_mask
    grad = x.T @ delta
    assert grad.shape == (d, h) and grad.frac_bits == 96
    assert np.allclose(SK.decrypt(grad), x.T @ ((g @ w2.T) * relu_mask), atol=1e-8)
    masked = grad + rng.normal(size=(d, h))
    assert masked.frac_bits == 96


def test_scales_align_on_addition_and_concatenation() -> None:
    x = np.array([1.5, -2.0, 0.125])
    a = PK.encrypt(x, frac_bits=16)
    b = a * 0.5  # 48 fractional bits
    s = a + b
    assert s.frac_bits == 48 and np.array_equal(SK.decrypt(s), x * 1.5)
    joined = concatenate([a.reshape(1, 3), b.reshape(1, 3)])
    assert joined.frac_bits == 48 and np.array_equal(SK.decrypt(joined), np.stack([x, x / 2]))
    assert np.array_equal(SK.decrypt(a - b), x / 2)
    assert np.array_equal(SK.decrypt(1.0 - a), 1.0 - x)
    assert np.array_equal(SK.decrypt(-a), -x)


def test_indexing_reshape_transpose_sum() -> None:
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4) - 11.5
    ca = PK.encrypt(x)
    assert np.array_equal(SK.decrypt(ca[1, :, 2:]), x[1, :, 2:])
    assert np.array_equal(SK.decrypt(ca[0, 1, 2]), x[0, 1, 2])
    assert np.array_equal(SK.decrypt(ca.reshape(6, 4).T), x.reshape(6, 4).T)
    for axis in (0, 1, 2, -1):
        assert np.array_equal(SK.decrypt(ca.sum(axis=axis)), x.sum(axis=axis))
    cp = PK.encrypt(x, pack=True)
    assert cp.slots == 4 and cp.data.shape == (2, 3, 1)
    assert np.array_equal(SK.decrypt(cp[1]), x[1])
    assert np.array_equal(SK.decrypt(cp.reshape(6, 4)), x.reshape(6, 4))
    assert np.array_equal(SK.decrypt(cp.sum(axis=1)), x.sum(axis=1))
    for bad in (lambda: cp.sum(axis=-1), lambda: cp.T, lambda: cp[..., 0], lambda: cp.reshape(4, 6)):
        with pytest.raises((ValueError, IndexError)):
            bad()


def test_packed_layout_and_per_ciphertext_multipliers() -> None:
    x = np.linspace(-5, 5, 30).reshape(3, 10)
    cp = PK.encrypt(x, slots=4)
    assert cp.data.shape == (3, 3) and cp.slot_width == (512 - 2) // 4
    assert np.array_equal(SK.decrypt(cp), quantize(x))
    col = np.array([[2.0], [-3.0], [0.5]])
    assert np.array_equal(SK.decrypt(cp * col), quantize(x) * col)
    with pytest.raises(ValueError, match="one plaintext for all its slots"):
        cp * np.arange(10.0)
    with pytest.raises(ValueError, match="rmatmul_plain"):
        cp @ np.ones((10, 2))
    with pytest.raises(ValueError, match="different packing"):
        cp + PK.encrypt(x)


def test_homomorphic_pack_shrinks_and_keeps_values() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 17))
    ca = PK.encrypt(x) @ rng.normal(size=(17, 17))  # an arithmetic result, not fresh
    packed = ca.pack()
    assert packed.slots > 1 and packed.data.size < ca.data.size
    assert np.array_equal(SK.decrypt(packed), SK.decrypt(ca))
    with pytest.raises(PaillierOverflowError):
        ca.pack(slots=40)  # 12-bit slots cannot hold ~70-bit values


def test_rerandomize_changes_ciphertexts_not_values() -> None:
    x = np.array([1.0, -2.0, 3.5])
    ca = PK.encrypt(x) * 3
    assert not ca.fresh
    rr = ca.rerandomize()
    assert rr.fresh and all(a != b for a, b in zip(rr.data, ca.data, strict=True))
    assert np.array_equal(SK.decrypt(rr), x * 3)
    again = PK.encrypt(x)
    assert all(a != b for a, b in zip(again.data, PK.encrypt(x).data, strict=True))


def test_encrypting_too_large_values_raises() -> None:
    with pytest.raises(PaillierOverflowError):
        PK.encrypt(np.array([2.0**480]))
    with pytest.raises(PaillierOverflowError):
        PK.encrypt(np.array([2.0**400]), slots=4)
    with pytest.raises(ValueError, match="NaN"):
        PK.encrypt(np.array([np.nan]))


def test_growth_past_the_plaintext_space_raises_instead_of_wrapping() -> None:
    ca = PK.encrypt(np.array([3.0, -3.0]))
    for _ in range(20):
        try:
            ca = ca * (2**60)
        except PaillierOverflowError as err:
            assert "plaintext space" in str(err)
            break
        got = SK.decrypt_encoded(ca)
        assert got[0] > 0 > got[1]  # every array that was allowed decrypts correctly
    else:
        pytest.fail("no overflow error after 20 multiplications by 2^60")
    with pytest.raises(PaillierOverflowError):
        PK.encrypt(np.ones(300)).sum() * 2.0**470


def test_packed_slot_overflow_raises() -> None:
    cp = PK.encrypt(np.linspace(-1.0, 1.0, 40), pack=True, headroom_bits=4)
    assert cp.slots == 510 // (34 + 4) and cp.slot_width == 39
    with pytest.raises(PaillierOverflowError, match="packed slot"):
        cp * 1000.0
    with pytest.raises(PaillierOverflowError):
        for _ in range(64):
            cp = cp + cp


def test_decrypt_detects_values_outside_the_tracked_bound() -> None:
    big = PK.encrypt(np.array([5.0e6, 1.0]))
    lying = CipherArray(PK, big.data, (2,), FRAC, bound=2**33)  # claims |values| < 2
    with pytest.raises(PaillierOverflowError, match="tracked bound"):
        SK.decrypt(lying)
    packed = PK.encrypt(np.array([1.0, 2.0, 3.0]), slots=3)
    tampered = packed.data * PK.encrypt(np.array([2.0**300]), frac_bits=0).data % PK.nsquare
    with pytest.raises(PaillierOverflowError):
        SK.decrypt(CipherArray(PK, tampered, (3,), FRAC, packed.bound, slots=3))


def test_mixing_keys_and_multiplying_ciphertexts_is_loud() -> None:
    a, b = PK.encrypt(np.ones(3)), OTHER_PK.encrypt(np.ones(3))
    with pytest.raises(KeyMismatchError, match=PK.key_id):
        a + b
    with pytest.raises(ValueError):
        concatenate([a, b])
    with pytest.raises(TypeError):
        a * a
    with pytest.raises(TypeError):
        a @ a


def test_worker_pool_gives_identical_values() -> None:
    rng = np.random.default_rng(6)
    x, w = rng.normal(size=(5, 6)), rng.normal(size=(6, 3))
    try:
        ca = PK.encrypt(x, workers=2)
        assert np.array_equal(SK.decrypt(ca, workers=2), quantize(x))
        assert np.array_equal(
            SK.decrypt_encoded(ca.matmul_plain(w, workers=2)), SK.decrypt_encoded(ca.matmul_plain(w))
        )
        assert np.array_equal(SK.decrypt(ca.mul(2.5, workers=2)), quantize(x) * 2.5)
        ints = np.arange(-3, 3)
        assert np.array_equal(SK.decrypt(ca.mul(ints, workers=2)), quantize(x) * ints)
        assert np.array_equal(SK.decrypt(ca.rerandomize(workers=2)), quantize(x))
    finally:
        shutdown_pools()


def test_phe_agrees_on_negative_multiplier_semantics() -> None:
    """phe multiplies by n - |k| via an inverse; the engine must give the same plaintext."""
    x = np.array([2.5, -4.0])
    got = SK.decrypt(PK.encrypt(x) * -7)
    ref = phe_decrypt_all([PHE_PK.encrypt(float(v)) * -7 for v in x])
    assert np.array_equal(got, ref) and isinstance(PHE_PK, phe.PaillierPublicKey)


def test_scalars_broadcasting_and_python_sum() -> None:
    s = PK.encrypt(2.5)
    assert s.shape == () and SK.decrypt(s) == 2.5
    assert SK.decrypt(s * 2 + 1) == 6.0 and SK.decrypt(1 - s) == -1.5 and SK.decrypt(s + s) == 5.0
    row, grid = PK.encrypt(np.arange(3.0)), PK.encrypt(np.ones((2, 3)))
    assert np.array_equal(SK.decrypt(row + grid), np.arange(3.0) + np.ones((2, 3)))
    assert np.array_equal(SK.decrypt(np.float64(2.0) * row), np.arange(3.0) * 2)
    assert np.array_equal(SK.decrypt(sum([row, row, row])), np.arange(3.0) * 3)
    empty = PK.encrypt(np.zeros((0, 3)))
    assert SK.decrypt(empty).shape == (0, 3) and np.array_equal(SK.decrypt(empty.sum(axis=0)), np.zeros(3))
