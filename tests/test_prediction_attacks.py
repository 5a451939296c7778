"""Paper 003's attacks on prediction outputs as pure algorithms: ESA (Example 1, exactness, rounding),
PRA against the random path, GRNA against random guess and naive regression."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from vflnet.attacks.esa import equality_solving
from vflnet.attacks.grna import GrnSettings, generative_regression, naive_regression
from vflnet.attacks.pra import correct_branching_rate, from_sklearn, path_restriction, random_path
from vflnet.defenses.rounding_scores import round_scores
from vflnet.metrics.features import correlation_diagnostics, esa_upper_bound, mse_per_feature, random_guess

# Example 1 of the paper: 3 classes; the bank holds age and income, the FinTech company deposit and shopping
THETA = np.array([[0.08, 0.0002, 0.0005, 0.09], [0.06, 0.0005, 0.0002, 0.08], [0.01, 0.0001, 0.0004, 0.05]])
X = np.array([25.0, 2000.0, 8000.0, 3.0])


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_example_1_exact_scores_give_the_exact_target_features() -> None:
    v = softmax(THETA @ X)
    np.testing.assert_allclose(v, [0.867, 0.084, 0.049], atol=5e-4)  # the paper's rounded v
    got = equality_solving(THETA[:, :2], THETA[:, 2:], X[None, :2], v[None])
    np.testing.assert_allclose(got, [[8000.0, 3.0]], rtol=1e-9)


def test_example_1_with_the_papers_truncated_a_prime_gives_its_estimate() -> None:
    # the paper computes with a'_1 = 2.334 and a'_2 = 0.539 and reports x_target = (8011.8, 3.046)
    v = softmax(np.array([2.334 + 0.539, 0.539, 0.0]))
    got = equality_solving(THETA[:, :2], THETA[:, 2:], X[None, :2], v[None])[0]
    assert got[0] == pytest.approx(8011.8, abs=0.05)
    assert got[1] == pytest.approx(3.046, abs=0.001)


def synthetic(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic dataset 1 of Table II (25 features, 10 classes) at reduced n, min-max normalised."""
    x, y = make_classification(
        n_samples=n,
        n_features=25,
        n_informative=10,
        n_redundant=10,
        n_classes=10,
        n_clusters_per_class=1,
        random_state=seed,
    )
    return (x - x.min(0)) / (x.max(0) - x.min(0)), y


def split_columns(d: int, d_target: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(
        d
    )  # the authors permute, the last d_target are the target's
    return np.sort(perm[:-d_target]), np.sort(perm[-d_target:])


@pytest.fixture(scope="module")
def lr_setting() -> tuple[np.ndarray, np.ndarray, LogisticRegression]:
    x, y = synthetic()
    model = LogisticRegression(max_iter=2000, fit_intercept=False).fit(x[:1500], y[:1500])
    return x[1500:], y[1500:], model


def test_esa_is_exact_when_the_target_holds_at_most_c_minus_1_features(lr_setting) -> None:
    x, _, model = lr_setting
    adv, target = split_columns(25, 9)  # c - 1 = 9
    v = model.predict_proba(x)
    got = equality_solving(model.coef_[:, adv], model.coef_[:, target], x[:, adv], v)
    assert mse_per_feature(got, x[:, target]) < 1e-8


def test_esa_beyond_c_minus_1_stays_under_its_upper_bound_and_random_guess(lr_setting) -> None:
    x, _, model = lr_setting
    adv, target = split_columns(25, 15)
    v = model.predict_proba(x)
    mse = mse_per_feature(
        equality_solving(model.coef_[:, adv], model.coef_[:, target], x[:, adv], v), x[:, target]
    )
    assert 1e-4 < mse < esa_upper_bound(x[:, target])
    assert mse < mse_per_feature(random_guess(x[:, target].shape, "uniform"), x[:, target])


def test_rounding_the_scores_to_one_decimal_breaks_esa(lr_setting) -> None:
    x, _, model = lr_setting
    adv, target = split_columns(25, 9)
    v = model.predict_proba(x)
    rounded = round_scores(v, 1)
    assert set(np.unique(rounded * 10).round(9)) <= set(range(11))
    mse = mse_per_feature(
        equality_solving(model.coef_[:, adv], model.coef_[:, target], x[:, adv], rounded), x[:, target]
    )
    uniform = mse_per_feature(random_guess(x[:, target].shape, "uniform"), x[:, target])
    assert mse > uniform  # the paper's Fig. 11a-b: above random guess at b = 1
    three = equality_solving(model.coef_[:, adv], model.coef_[:, target], x[:, adv], round_scores(v, 3))
    assert mse_per_feature(three, x[:, target]) < mse  # b = 3 hurts far less


def test_pra_beats_the_random_path() -> None:
    x, y = synthetic(4000, seed=1)
    tree = DecisionTreeClassifier(max_depth=5, min_samples_leaf=5, random_state=0).fit(x[:2000], y[:2000])
    adv, target = split_columns(25, 5)
    view = from_sklearn(tree, adv, target)
    xp = x[2000:]
    predicted = tree.predict(xp)
    pra = correct_branching_rate(view, path_restriction(view, xp[:, adv], predicted, seed=0), xp[:, target])
    rnd = correct_branching_rate(view, random_path(view, len(xp), seed=0), xp[:, target])
    assert pra[1] > 100 and rnd[1] > 100
    assert pra[0] / pra[1] > rnd[0] / rnd[1] + 0.1


def test_grna_beats_random_guess_and_naive_regression_on_the_synthetic_configuration(lr_setting) -> None:
    torch.set_num_threads(1)
    x, _, model = lr_setting
    x = x[:1000]
    adv, target = split_columns(25, 10)  # 40% of the features, as in Table III
    w = torch.tensor(model.coef_, dtype=torch.float32)

    def f(xx: torch.Tensor) -> torch.Tensor:
        return torch.softmax(xx @ w.T, 1)

    v = model.predict_proba(x)
    truth = x[:, target]
    grn = mse_per_feature(generative_regression(f, x[:, adv], v, adv, target, GrnSettings(epochs=10)), truth)
    naive = mse_per_feature(naive_regression(f, x[:, adv], v, adv, target), truth)
    uniform = mse_per_feature(random_guess(truth.shape, "uniform"), truth)
    gaussian = mse_per_feature(random_guess(truth.shape, "gaussian"), truth)
    assert grn < 0.6 * min(uniform, gaussian)
    assert grn < naive


def test_correlation_diagnostics_find_a_copied_feature() -> None:
    rng = np.random.default_rng(0)
    x_adv = rng.uniform(size=(500, 3))
    x_target = np.stack([x_adv[:, 0], rng.uniform(size=500)], 1)
    v = np.stack([x_adv[:, 0], 1 - x_adv[:, 0]], 1)
    with_adv, with_v = correlation_diagnostics(x_adv, v, x_target)
    assert with_adv[0] > 0.3 > with_adv[1]
    assert with_v[0] == pytest.approx(1.0) and with_v[1] < 0.2
