"""The `secureboost` protocol: the tree algorithm against scikit-learn, encrypted histograms against
plaintext ones, a tree grown over gRPC in the HE mode against the one-process run of the same
algorithm, and bad input."""

from __future__ import annotations

import numpy as np
import phe
import pytest
import torch
from sklearn.tree import DecisionTreeClassifier

from tests.conftest import write_config
from vflnet.crypto import generate_keypair
from vflnet.models.secureboost import (
    FRAC_BITS,
    LocalParty,
    TreeParams,
    bucketize,
    candidate_thresholds,
    grad_hess,
    histograms_encrypted,
    histograms_plain,
    packed_shape,
    predict_local,
    train_local,
    unpack_histograms,
)
from vflnet.protocols.secureboost import gh_slots
from vflnet.runner.local import run_local
from vflnet.runner.reference import tree_views
from vflnet.tools.bench.secureboost_phe import PhePassive, PheRemote, PheWire, encrypt_rows, phe_tree
from vflnet.validation import config_from_dict

PARTIES = ["active", "passive-1", "passive-2"]


def tree_config(mode: str = "he", n: int | None = None) -> dict:
    """Paper 003's decision tree (depth 5) on digits, the image split into three parties' column strips.
    Pixels take at most 17 values, so every party's candidates are all its distinct values: the
    candidates of an exact (scikit-learn) tree."""
    regions = {"active": [0, 8, 0, 3], "passive-1": [0, 8, 3, 6], "passive-2": [0, 8, 6, 8]}
    parties = [{"name": "coordinator", "role": "coordinator"}] + [
        {
            "name": name,
            "role": "active" if name == "active" else "passive",
            "features": {"region": regions[name]},
            "bottom": {"kind": "splits", "out": 10},
        }
        for name in PARTIES
    ]
    return {
        "run": {"seed": 5, "id": f"secureboost-{mode}"},
        "protocol": {
            "kind": "secureboost",
            "aggregation": "sum",
            # the key only in the HE mode: the plain mode does not read it (and refuses it)
            "params": {
                "mode": mode,
                "max_depth": 5,
                "n_bins": 32,
                **({"key_bits": 1024} if mode == "he" else {}),
            },
        },
        "data": {"dataset": "digits", "params": {"n": n}, "test_fraction": 0.25},
        "parties": parties,
        "model": {"top": {"kind": "none"}},
        "train": {"epochs": 1, "batch_size": 100_000},
        "predict": {"set": "test", "batch_size": 128},
    }


def one_process(cfg, params: TreeParams, trees: int = 1):
    """The same algorithm in this process, on the columns each party holds, normalised as it does."""
    v = tree_views(cfg)
    ensemble, parties = train_local(v.xs, v.y, v.n_classes, params, [v.train_rows] * trees, v.train_rows)
    return ensemble, parties, v.xs, v.y, v.train_rows, v.test_rows, v.test_ids


def test_a_one_process_tree_is_within_a_point_of_sklearns_tree_of_the_same_depth() -> None:
    cfg = config_from_dict(tree_config("plain"))
    ensemble, parties, xs, y, train_rows, test_rows, _ = one_process(cfg, TreeParams(max_depth=5, n_bins=32))
    ours = (predict_local(ensemble, parties, test_rows).argmax(1) == y[test_rows]).mean()
    x = np.concatenate([a.reshape(len(a), -1) for a in xs], 1)
    sk = DecisionTreeClassifier(max_depth=5, random_state=0).fit(x[train_rows], y[train_rows])
    assert abs(ours - sk.score(x[test_rows], y[test_rows])) <= 0.01


def test_encrypted_histograms_decrypt_to_exactly_the_plaintext_ones() -> None:
    rng = np.random.default_rng(0)
    n, c = 300, 3
    x = rng.normal(size=(n, 4))
    gh = grad_hess(rng.integers(0, c, n), rng.normal(size=(n, c)))
    thresholds = candidate_thresholds(x, 8)
    buckets, m = bucketize(x, thresholds), [len(t) for t in thresholds]
    node_of = rng.integers(-1, 3, n)
    public, private = generate_keypair(1024)
    slots = gh_slots(public, n)
    ca = public.encrypt(gh / float(1 << FRAC_BITS), FRAC_BITS, slots=slots)
    hist = histograms_encrypted(buckets, m, node_of, [0, 2], ca)
    assert hist.shape == packed_shape(2, sum(m), 2 * c, slots) and hist.shape[1] < sum(m)  # packed
    got = unpack_histograms(np.asarray(private.decrypt_encoded(hist), dtype=np.int64), sum(m), 2 * c)
    np.testing.assert_array_equal(got, histograms_plain(buckets, m, node_of, [0, 2], gh))


def test_the_phe_tree_of_the_bench_decrypts_to_the_plaintext_histograms_and_grows_the_same_tree() -> None:
    """`vflnet bench secureboost`'s phe row is a real run: one EncryptedNumber per value, 512-bit keys
    (small keys: this test is about the arithmetic, not security)."""
    cfg = config_from_dict(tree_config("plain", n=240))
    v = tree_views(cfg)
    run = phe_tree(v.xs, v.y, v.n_classes, TreeParams(max_depth=3, n_bins=8), v.train_rows, 512)
    assert run.same_tree and (run.tree.kind == 1).sum() >= 3
    width = 2 * 512 // 8
    gh_bytes = 2 * len(v.train_rows) * 2 * v.n_classes * width  # gh to both passive parties
    assert run.bytes_sent > gh_bytes and run.bytes_sent % width == 0
    # a passive party's phe histograms decrypt to exactly the plaintext ones
    public, private = phe.generate_paillier_keypair(n_length=512)
    gh = grad_hess(v.y[v.train_rows], np.zeros((len(v.train_rows), v.n_classes)))
    local = LocalParty.fit(v.xs[1], v.train_rows, 8)
    wire = PheWire(public)
    party = PhePassive(local, wire)
    party.start_tree(v.train_rows, wire.send(encrypt_rows(public, gh)), gh.shape[1])
    node_of = np.random.default_rng(0).integers(-1, 2, len(v.train_rows))
    got = PheRemote(party, private, gh.shape[1]).histograms(node_of, [0, 1])
    np.testing.assert_array_equal(
        got, histograms_plain(local.buckets, local.n_candidates, node_of, [0, 1], gh)
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_a_tree_grown_over_grpc_in_he_mode_equals_the_one_process_run(tmp_path) -> None:
    data = tree_config("he", n=600)
    run_dir = tmp_path / "run"
    assert run_local(write_config(tmp_path, data), run_dir=run_dir, progress=False) == 0
    cfg = config_from_dict(data)
    params = TreeParams(max_depth=5, n_bins=32)
    ensemble, parties, xs, y, train_rows, test_rows, test_ids = one_process(cfg, params)
    # the label holder's tree: the same splits, each known as (party, split id) only
    with np.load(run_dir / "checkpoints/active.trees.npz") as f:
        assert list(f["owners"]) == PARTIES
        for key, value in ensemble.trees[0].to_dict().items():
            np.testing.assert_array_equal(f[f"tree0000_{key}"], value, err_msg=key)
    assert (ensemble.trees[0].kind == 1).sum() >= 7 and {0, 1, 2} & set(ensemble.trees[0].owner.tolist())
    # each party's thresholds stay with it (checkpoint of its split table)
    for name, party in zip(PARTIES, parties, strict=True):
        table = torch.load(run_dir / "checkpoints" / f"{name}.pt")["modules"]["bottom"]
        np.testing.assert_array_equal(table["feature"].numpy(), party.features)
        np.testing.assert_array_equal(table["threshold"].numpy(), party.cuts)
    # predictions: each party evaluated its own nodes; the same confidence vectors as in one process
    with np.load(run_dir / "predictions/predict-epoch-000.npz") as f:
        ids, got = f["sample_ids"], f["confidence"]
    order = {int(i): r for i, r in zip(test_ids, test_rows, strict=True)}
    rows = np.array([order[int(i)] for i in ids])
    np.testing.assert_array_equal(got, predict_local(ensemble, parties, rows))
    x = np.concatenate([a.reshape(len(a), -1) for a in xs], 1)
    sk = DecisionTreeClassifier(max_depth=5, random_state=0).fit(x[train_rows], y[train_rows])
    ours = (got.argmax(1) == y[rows]).mean()
    assert abs(ours - sk.score(x[rows], y[rows])) <= 0.01


def test_boosting_over_loopback_equals_the_one_process_run(tmp_path) -> None:
    """Gradient boosting (paper 003's ensembles: trees of depth 3), one tree per epoch, plain mode."""
    data = tree_config("plain", n=400)
    data["protocol"]["params"].update(ensemble="boost", max_depth=3, learning_rate=0.5, reg_lambda=1.0)
    data["train"]["epochs"] = 4
    data["transport"] = {"bridge": "loopback"}
    run_dir = tmp_path / "run"
    assert run_local(write_config(tmp_path, data), run_dir=run_dir, progress=False) == 0
    cfg = config_from_dict(data)
    params = TreeParams(max_depth=3, n_bins=32, ensemble="boost", learning_rate=0.5, reg_lambda=1.0)
    ensemble, parties, _, _, _, test_rows, test_ids = one_process(cfg, params, trees=4)
    with np.load(run_dir / "predictions/predict-epoch-003.npz") as f:
        ids, got = f["sample_ids"], f["confidence"]
    order = {int(i): r for i, r in zip(test_ids, test_rows, strict=True)}
    rows = np.array([order[int(i)] for i in ids])
    np.testing.assert_allclose(got, predict_local(ensemble, parties, rows), rtol=0, atol=1e-12)
    assert len(ensemble.trees) == 4 and not np.allclose(got, got[0])
