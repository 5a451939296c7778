"""Paper 000's binary feature reconstruction: the search algorithms on matrices (no wire), Theorem 1
on the split protocol's own compute, and the bottom defenses as modules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflnet.attacks import feature_reconstruction as fr
from vflnet.attacks.binary_features import FeatureReconstruction, estimate_rank
from vflnet.config import LRScheduleConfig, OptimizerConfig
from vflnet.defenses.embedding_defenses import Masquerade, NoisyEmbedding
from vflnet.models.local import LocalModel
from vflnet.models.zoo import TopModel
from vflnet.protocols.split import ActiveSplit, PassiveSplit
from vflnet.threat.attack import AttackContext


def passive_data(
    rng: np.random.Generator, n: int, n_real: int, n_binary: int, onehot: list[int]
) -> np.ndarray:
    cols = [rng.normal(size=(n, n_real)), (rng.random((n, n_binary)) < 0.35).astype(np.float64)]
    cols += [np.eye(m)[rng.integers(0, m, n)] for m in onehot]
    return np.hstack(cols)


def embeddings(x: np.ndarray, rng: np.random.Generator, k_factor: int = 3) -> np.ndarray:
    """z_A = W_A x_A as the wire carries it (float32)."""
    w = rng.normal(size=(k_factor * x.shape[1], x.shape[1])) / np.sqrt(x.shape[1])
    return (x @ w.T).astype(np.float32)


def found(z: np.ndarray, method: str = "mitm", bias_trick: bool = False) -> np.ndarray:
    a, s = fr.attack_basis(z, bias_trick=bias_trick)
    m, pivots = fr.solve_matrix(a)
    codes = fr.search_mitm(m, pivots) if method == "mitm" else fr.search_brute(m)
    return fr.hit_vectors(m, codes)


@pytest.mark.parametrize(
    "seed, n, n_real, n_binary, onehot",
    [
        (0, 400, 5, 2, []),
        (1, 300, 3, 3, [4]),
        (2, 200, 0, 9, []),  # all-binary rows: many coincidences on single rows
        (3, 30, 6, 2, [3]),  # few rows: spurious hits exist, both searches must list the same
        (4, 500, 4, 1, [3, 2]),
        (5, 14, 9, 1, []),  # n barely above d
    ],
)
def test_mitm_returns_exactly_the_brute_force_hits(
    seed: int, n: int, n_real: int, n_binary: int, onehot: list[int]
) -> None:
    rng = np.random.default_rng(seed)
    z = embeddings(passive_data(rng, n, n_real, n_binary, onehot), rng)
    a, _ = fr.attack_basis(z)
    m, pivots = fr.solve_matrix(a)
    brute = fr.search_brute(m)
    assert len(brute) > 0
    np.testing.assert_array_equal(fr.search_mitm(m, pivots), brute)


def test_every_binary_feature_and_every_onehot_subset_sum_is_found() -> None:
    rng = np.random.default_rng(7)
    x = passive_data(rng, 1500, 4, 2, [4])
    raw = found(embeddings(x, rng))
    truth = x[:, 4:].astype(np.uint8)  # 2 binary + 4 one-hot columns
    sums = {(truth[:, 2:] @ np.array(s)).astype(np.uint8).tobytes() for s in np.ndindex(2, 2, 2, 2) if any(s)}
    # the group is complete, so the all-ones vector and every complement are in the span too
    assert sums <= {v.tobytes() for v in raw}  # all 2^4 - 1 subset sums
    for j in range(6):
        assert any(np.array_equal(v, truth[:, j]) for v in raw)
    canon = fr.canonical_hits(raw)
    assert not any(v.all() or not v.any() for v in canon)
    assert len({min(v.tobytes(), (1 - v).tobytes()) for v in canon}) == len(canon)
    groups = fr.onehot_groups(raw)
    assert len(groups) == 1 and len(groups[0]) == 4
    atoms = sorted(raw[i].tobytes() for i in groups[0])
    assert atoms == sorted(truth[:, j].tobytes() for j in range(2, 6))
    cat = fr.categorical(raw, groups[0])
    # the reassembled categorical equals the true one up to naming the categories
    true_cat = truth[:, 2:].argmax(axis=1)
    assert len({(a, b) for a, b in zip(cat, true_cat, strict=True)}) == 4


def test_gaussian_features_alone_give_no_hit() -> None:
    rng = np.random.default_rng(3)
    assert len(found(embeddings(rng.normal(size=(800, 10)), rng))) == 0


def test_bias_trick_recovers_standardised_features_up_to_complement() -> None:
    rng = np.random.default_rng(11)
    x = passive_data(rng, 1000, 5, 3, [])
    standardised = (x - x.mean(axis=0)) / x.std(axis=0)  # each column an {a, b} encoding, no bias
    w = rng.normal(size=(24, 8))
    z = (standardised @ w.T).astype(np.float32)
    truth = x[:, 5:].astype(np.uint8)
    assert len(found(z)) == 0  # the plain search sees no {0, 1} vector
    canon = fr.canonical_hits(found(z, bias_trick=True))
    assert len(canon) == 3
    for j in range(3):
        assert any(np.array_equal(v, truth[:, j]) or np.array_equal(v, 1 - truth[:, j]) for v in canon)
    # a passive bias adds the all-ones vector to the span (rank d_A + 1): the plain search then finds
    # the features, their complements and the all-ones vector
    biased = fr.canonical_hits(found((standardised @ w.T + rng.normal(size=24)).astype(np.float32)))
    assert sorted(v.tobytes() for v in biased) == sorted(v.tobytes() for v in canon)


def test_rank_estimate_uses_the_gap_under_noise() -> None:
    rng = np.random.default_rng(5)
    z = embeddings(passive_data(rng, 1000, 6, 2, []), rng)
    _, s = fr.attack_basis(z)
    assert estimate_rank(s, 1e-5) == 8
    _, s_noisy = fr.attack_basis(z + rng.normal(scale=0.05, size=z.shape))
    assert estimate_rank(s_noisy, 1e-5) == 8


def test_algorithm2_finds_the_feature_and_the_paper_rule_degenerates_under_noise() -> None:
    rng = np.random.default_rng(2)
    x = passive_data(rng, 1500, 7, 1, [])
    feature = x[:, 7].astype(np.uint8)
    z = embeddings(x, rng)
    scale = float(np.sqrt((z**2).mean()))
    clean = fr.leverage_regression(fr.attack_basis(z, rank=8)[0], 9, 5, np.random.default_rng(0))
    assert np.array_equal(clean.normalized, feature) and np.array_equal(clean.paper, feature)
    noisy_z = z + rng.normal(scale=0.4 * scale, size=z.shape)
    noisy = fr.leverage_regression(fr.attack_basis(noisy_z, rank=8)[0], 9, 20, np.random.default_rng(0))
    # the literal rule prefers a near-empty vector (residual <= 1); the normalised one still finds it
    assert noisy.paper.sum() <= 3
    assert (noisy.normalized == feature).mean() > 0.95


def test_masquerade_module_has_rank_d_minus_1_plus_the_fabricated_feature() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(passive_data(rng, 2000, 6, 2, []).astype(np.float32))
    module = Masquerade(8, 40, "per_sample", seed=9)
    w = module.p.weight.double() @ module.q.weight.double()
    assert torch.linalg.matrix_rank(w).item() == 7
    a = module.fabricated(x)
    assert torch.equal(a, module.fabricated(x))  # fixed per record
    assert 0.4 < float(a.mean()) < 0.6
    z = module(x).detach().numpy()
    raw = found(z)
    assert len(raw) == 1 and np.array_equal(raw[0], a.numpy().astype(np.uint8))
    fresh = Masquerade(8, 40, "per_message", seed=9)
    assert not torch.equal(fresh.fabricated(x), fresh.fabricated(x))


def test_embedding_noise_keeps_the_gradient_of_w_a() -> None:
    torch.manual_seed(0)
    inner = torch.nn.Linear(5, 7, bias=False)
    noisy = NoisyEmbedding(inner, 0.5, seed=1)
    x = torch.randn(16, 5)
    out = noisy(x)
    assert not torch.allclose(out, inner(x))
    g = torch.randn(16, 7)
    out.backward(g)
    np.testing.assert_allclose(inner.weight.grad.numpy(), (g.T @ x).numpy(), rtol=1e-5)


MOMENTUM = OptimizerConfig(kind="momentum", lr=0.1, momentum=0.9, weight_decay=1e-4)  # the paper's


def _train_stream(
    w0: np.ndarray, x_a: np.ndarray, x_b: np.ndarray, y: np.ndarray, opt: OptimizerConfig = MOMENTUM
) -> list[np.ndarray]:
    """z_A of every step of a short training run on the split protocol's compute, then of a
    prediction pass."""
    from vflnet.config import ModelConfig

    bottom_a = torch.nn.Linear(w0.shape[1], w0.shape[0], bias=False).double()
    with torch.no_grad():
        bottom_a.weight.copy_(torch.from_numpy(w0))
    torch.manual_seed(1)
    bottom_b = torch.nn.Linear(x_b.shape[1], w0.shape[0]).double()
    top = TopModel(ModelConfig(kind="mlp", hidden=[8], input_activation="relu"), w0.shape[0], 2).double()
    passive = PassiveSplit(LocalModel({"bottom": bottom_a}, opt, LRScheduleConfig()))
    active = ActiveSplit(LocalModel({"bottom": bottom_b, "top": top}, opt, LRScheduleConfig()), "sum")
    stream = []
    for step in range(12):
        rows = np.arange(step * 10, step * 10 + 10) % len(y)
        z = passive.forward(x_a[rows], train=True)
        stream.append(z)
        result = active.step(x_b[rows], [z], y[rows], train=True)
        active.update()
        passive.backward(result.grads[0])
    stream.append(passive.forward(x_a, train=False))
    return stream


def test_theorem_1_rotated_weights_and_inputs_send_the_same_stream() -> None:
    torch.set_default_dtype(torch.float64)
    try:
        rng = np.random.default_rng(0)
        x_a, x_b = rng.normal(size=(60, 5)), rng.normal(size=(60, 4))
        y = rng.integers(0, 2, 60)
        w0 = rng.normal(size=(12, 5))
        u, _ = np.linalg.qr(rng.normal(size=(5, 5)))  # an orthogonal U
        plain = _train_stream(w0, x_a, x_b, y)
        rotated = _train_stream(w0 @ u.T, x_a @ u.T, x_b, y)  # W_A U^T and rows U x_A
        for a, b in zip(plain, rotated, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-9)
        # and the inputs do differ: the attacker's view cannot tell X_A from X_A U^T
        assert np.abs(x_a - x_a @ u.T).max() > 0.5
        # Remark 2 extends the proof to Adam, but Adam's per-coordinate step is not rotation
        # equivariant: there the two streams part after the first update
        adam = OptimizerConfig(kind="adam", lr=0.01)
        plain, rotated = (
            _train_stream(w0, x_a, x_b, y, adam),
            _train_stream(w0 @ u.T, x_a @ u.T, x_b, y, adam),
        )
        np.testing.assert_allclose(plain[0], rotated[0], atol=1e-9)
        assert np.abs(plain[-1] - rotated[-1]).max() > 1e-3
    finally:
        torch.set_default_dtype(torch.float32)


def test_attack_refuses_fewer_rows_than_unknowns_and_checks_its_params() -> None:
    attack = FeatureReconstruction(AttackContext("active", "active", "t"), tol=0.01, rank=4)
    rng = np.random.default_rng(0)
    out = attack.attack(embeddings(passive_data(rng, 4, 3, 1, []), rng))
    assert int(out["too_few_rows"]) == 4 and "alg1_raw_hits" not in out and "alg2" not in out
    with pytest.raises(ValueError, match="tol"):
        FeatureReconstruction(AttackContext("active", "active", "t"), tol=0.7)


def test_adaptive_attack_finds_only_what_the_plain_search_already_finds() -> None:
    """Sec. VII's adaptive attack (search again on the rows where a = 0) reaches a true binary column only
    when it lies in W_A's rank-(d_A - 1) image, e_j in Q's row space; but then the plain search finds it
    on every row already. Here Q drops a Gaussian column: both find the two binary columns."""
    torch.manual_seed(0)
    rng = np.random.default_rng(4)
    x = passive_data(rng, 1500, 6, 2, [])
    module = Masquerade(8, 40, "per_sample", seed=3)
    with torch.no_grad():
        module.q.weight.copy_(torch.eye(8)[1:])  # null vector e_0, a Gaussian column
    rows = torch.from_numpy(x.astype(np.float32))
    z = module(rows).detach().numpy()
    a = module.fabricated(rows).numpy().astype(np.uint8)
    attack = FeatureReconstruction(AttackContext("active", "active", "t"), algorithm="1")
    plain = {h.tobytes() for h in attack.attack(z)["alg1_raw_hits"]}
    assert plain == {a.tobytes(), *(x[:, j].astype(np.uint8).tobytes() for j in (6, 7))}
    out = attack.adaptive(z, a)
    kept = out["adaptive_rows"]
    assert int(out["adaptive_rank"]) == 7 and np.all(a[kept] == 0)
    for j in (6, 7):
        col = x[kept, j].astype(np.uint8)
        assert any(np.array_equal(h, col) or np.array_equal(h, 1 - col) for h in out["adaptive_hits"])
