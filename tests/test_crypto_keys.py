"""Key generation, key files, fingerprints and interoperability with phe."""

from __future__ import annotations

import json
import os
import stat
import warnings

import numpy as np
import phe
import pytest

from vflnet.crypto import (
    KeyMismatchError,
    PrivateKey,
    PublicKey,
    generate_keypair,
    key_id_of,
    load_keypair,
    load_public_key,
    save_keypair,
    save_public_key,
)
from vflnet.crypto.interop import from_phe_numbers, to_phe_numbers

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    PK, SK = generate_keypair(512, allow_insecure=True)


def test_insecure_sizes_need_opt_in_and_warn() -> None:
    with pytest.raises(ValueError, match="insecure"):
        generate_keypair(512)
    with pytest.warns(UserWarning, match="INSECURE 512-bit"):
        pk, sk = generate_keypair(512, allow_insecure=True)
    assert pk.bits == 512 and sk.p * sk.q == pk.n and sk.p != sk.q


def test_1024_bit_keys_are_exact_size_and_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pk, sk = generate_keypair(1024)
    assert pk.n.bit_length() == 1024
    assert sk.p.bit_length() == sk.q.bit_length() == 512
    x = np.array([0.25, -3.5])
    assert np.array_equal(sk.decrypt(pk.encrypt(x)), x)


def test_odd_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        generate_keypair(1025)


def test_key_id_is_a_stable_fingerprint_of_n() -> None:
    # known answer: the first 16 hex digits of sha256 over n's big-endian bytes (n = 3233 = 0x0ca1)
    assert key_id_of(3233) == "e2e6d79b3f9ba9e4"
    assert PublicKey(3233).key_id == "e2e6d79b3f9ba9e4"
    assert len(PK.key_id) == 16 and set(PK.key_id) <= set("0123456789abcdef")
    assert PublicKey(int(PK.n)).key_id == PK.key_id
    assert PublicKey(int(PK.n) + 2).key_id != PK.key_id


def test_keypair_file_round_trip(tmp_path) -> None:
    path = tmp_path / "key.json"
    save_keypair(path, SK)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    pk, sk = load_keypair(path)
    assert pk == PK and sk.p == SK.p and sk.q == SK.q
    obj = json.loads(path.read_text())
    assert int(obj["n"]) == PK.n and {"p", "q", "key_id"} <= set(obj)
    ca = PK.encrypt(np.array([1.5, -2.0]))
    assert np.array_equal(sk.decrypt(ca), [1.5, -2.0])

    pub_path = tmp_path / "pub.json"
    save_public_key(pub_path, PK)
    assert "p" not in json.loads(pub_path.read_text())
    assert load_public_key(pub_path) == PK


def test_corrupt_key_files_are_rejected(tmp_path) -> None:
    obj = SK.to_json()
    bad_id = dict(obj, key_id="0" * 16)
    with pytest.raises(ValueError, match="key_id"):
        PrivateKey.from_json(bad_id)
    with pytest.raises(ValueError, match="p \\* q"):
        PrivateKey.from_json(dict(obj, q=str(int(SK.q) + 2)))
    with pytest.raises(ValueError, match="kind"):
        PublicKey.from_json({"kind": "something", "n": obj["n"]})


def test_phe_key_conversion_round_trip() -> None:
    phe_pk, phe_sk = PK.to_phe(), SK.to_phe()
    assert isinstance(phe_pk, phe.PaillierPublicKey) and phe_pk.n == PK.n
    assert PublicKey.from_phe(phe_pk) == PK
    back = PrivateKey.from_phe(phe_sk)
    assert back.public_key == PK and {back.p, back.q} == {SK.p, SK.q}


def test_phe_encrypts_engine_decrypts() -> None:
    phe_pk = PK.to_phe()
    values = [0.0, -1.25, 3.0e-7, 12345.678, -99.5]
    numbers = [phe_pk.encrypt(v) for v in values]
    ca = from_phe_numbers(numbers, PK, max_abs=20000.0)
    assert np.allclose(SK.decrypt(ca), values, rtol=0, atol=1e-12)
    # engine arithmetic on phe ciphertexts, decrypted by phe again
    doubled = to_phe_numbers(ca * 2 + 1.0)
    assert np.allclose([SK.to_phe().decrypt(x) for x in doubled], np.array(values) * 2 + 1, atol=1e-9)


def test_engine_encrypts_phe_decrypts() -> None:
    values = np.array([[0.5, -7.0, 0.0], [1e-6, 2.0**20, -3.25]])
    for frac in (32, 30, 0):
        ca = PK.encrypt(np.round(values) if frac == 0 else values, frac_bits=frac)
        numbers = to_phe_numbers(ca)
        got = np.array([[SK.to_phe().decrypt(x) for x in row] for row in numbers])
        assert np.allclose(got, SK.decrypt(ca), rtol=0, atol=1e-12)


def test_phe_numbers_under_another_key_are_refused() -> None:
    other_pk, _ = phe.generate_paillier_keypair(n_length=512)
    with pytest.raises(ValueError):
        from_phe_numbers([other_pk.encrypt(1.0)], PK, max_abs=1.0)


def test_decrypting_with_the_wrong_key_is_loud() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, other_sk = generate_keypair(512, allow_insecure=True)
    with pytest.raises(KeyMismatchError):
        other_sk.decrypt(PK.encrypt(np.ones(2)))
