"""Paper 003's attacks wired into runs (loopback bridge: the same protocol code, one process): the
active party gets the confidence vectors of the prediction phase and the passive party's model through
a model release; scores come from the runner, against the features the passive party holds."""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_config
from vflnet.runner.local import run_local


def _config(
    protocol: dict, bottom: dict, n_classes: int, active_cols: str, attacks: list, defenses=()
) -> dict:
    return {
        "run": {"seed": 1, "id": "paper003"},
        "protocol": protocol,
        "data": {
            "dataset": "synthetic",
            "params": {
                "n_samples": 1000,
                "n_features": 20,
                "n_informative": 8,
                "n_redundant": 6,
                "n_classes": n_classes,
            },
            "normalize": "minmax",
            "test_fraction": 0.3,
        },
        "parties": [
            {"name": "coordinator", "role": "coordinator"},
            {"name": "active", "role": "active", "features": {"columns": active_cols}, "bottom": bottom},
            {
                "name": "passive-1",
                "role": "passive",
                "features": {"columns": active_cols.split(":")[1] + ":20"},
                "bottom": bottom,
            },
        ],
        "model": {"top": {"kind": "none"}},
        "train": {"epochs": 5, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 0.05}},
        "predict": {"set": "test", "batch_size": 100},
        "model_release": [
            {"owner": "passive-1", "recipient": "active", "modules": ["bottom"], "when": "end"}
        ],
        "attacks": attacks,
        "defenses": list(defenses),
        "transport": {"bridge": "loopback"},
    }


def _scores(tmp_path, data) -> dict:
    run_dir = tmp_path / "run"
    assert run_local(write_config(tmp_path, data), run_dir=run_dir, progress=False) == 0
    return json.loads((run_dir / "attacks/scores.json").read_text())


LR = {"kind": "linear", "bias": False, "out": 10}
SPLIT = {"kind": "split", "aggregation": "sum"}


def test_esa_at_the_active_party_recovers_the_passive_features_exactly(tmp_path) -> None:
    # 10 classes, the passive party holds 9 = c - 1 features
    got = _scores(tmp_path, _config(SPLIT, LR, 10, "0:11", [{"name": "esa", "party": "active"}]))[
        "esa@active"
    ]
    assert got["d_target"] == 9 and got["n"] == 300
    assert got["mse"] < 1e-8


def test_rounding_the_released_scores_breaks_esa(tmp_path) -> None:
    data = _config(
        SPLIT,
        LR,
        10,
        "0:11",
        [{"name": "esa", "party": "active"}],
        [{"name": "round-scores", "party": "active", "params": {"decimals": 1}}],
    )
    got = _scores(tmp_path, data)["esa@active"]
    assert got["mse"] > got["mse_uniform"]


def test_pra_and_grna_on_a_secureboost_tree(tmp_path) -> None:
    protocol = {"kind": "secureboost", "aggregation": "sum", "params": {"mode": "plain", "max_depth": 5}}
    data = _config(
        protocol,
        {"kind": "splits", "out": 4},
        4,
        "0:14",
        [
            {"name": "pra", "party": "active"},
            {"name": "grna", "party": "active", "params": {"epochs": 5, "dummy_factor": 5}},
        ],
    )
    data["train"] = {"epochs": 1, "batch_size": 100_000}
    scores = _scores(tmp_path, data)
    pra, grna = scores["pra@active"], scores["grna@active"]
    assert pra["branches"] > 100 and pra["cbr"] > pra["cbr_random"] + 0.1
    assert grna["mse"] < min(grna["mse_uniform"], grna["mse_gaussian"])
    assert grna["cbr"] > grna["cbr_uniform"]  # Fig. 8: branches of the estimates vs of a random guess


@pytest.mark.parametrize("attack", ["esa", "pra", "grna"])
def test_the_attacks_need_a_release_and_the_prediction_phase(tmp_path, attack) -> None:
    from vflnet.config import ConfigError
    from vflnet.validation import config_from_dict

    no_release = _config(SPLIT, LR, 10, "0:11", [{"name": attack, "party": "active"}])
    no_release["model_release"] = []
    no_predictions = _config(SPLIT, LR, 10, "0:11", [{"name": attack, "party": "active"}])
    no_predictions["predict"] = {"set": "none"}
    for data, kind in ((no_release, "released_model"), (no_predictions, "predictions")):
        with pytest.raises(ConfigError) as info:
            config_from_dict(data)
        assert kind in str(info.value)


def test_the_reproductions_correlation_table_scores_grna_per_target_feature(tmp_path) -> None:
    """`vflnet reproduce prediction-attacks --tables correlations`: one row per target feature (breast_cancer,
    40% of 30 features), each a GRNA MSE and two correlations in [-1, 1] (Eqs. 16-17)."""
    from vflnet.tools.reproduce import prediction_attacks

    assert prediction_attacks.main(["--quick", "--tables", "correlations", "--out-dir", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    rows = [r.strip("|").split("|") for r in report.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert sorted(int(r[0]) for r in rows) == list(range(12))
    for _, mse, with_adv, with_v in rows:
        assert 0 < float(mse) < 1 and abs(float(with_adv)) <= 1 and abs(float(with_v)) <= 1
    assert "Pearson r between a feature's MSE" in report
    with pytest.raises(SystemExit):
        prediction_attacks.main(["--tables", "no-such-table", "--out-dir", str(tmp_path)])


def test_the_reproductions_ablation_table_gives_a_t_interval_over_the_trials(tmp_path, monkeypatch) -> None:
    """Table III's cells are the mean ± the t-based 95% half-width over the trials (k - 1 degrees of
    freedom, the sample standard deviation), in the report and in results.json; each case's
    difference from the full GRN is taken trial by trial. The runs are stubbed with known MSEs."""
    from vflnet.tools.reproduce import prediction_attacks as pa

    # [1, 2, 3, 4, 5]: mean 3, s = sqrt(2.5), t_{0.975, 4} = 2.776445; half-width 2.776445 * s / sqrt(5)
    mean, half = pa.mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0 and half == pytest.approx(1.963243, abs=1e-6)
    assert pa.mean_ci([0.5])[1] != pa.mean_ci([0.5])[1]  # one trial: nan, no interval

    trials = {5: [0.10, 0.12, 0.11], 3: [0.09, 0.10, 0.11]}  # case -> MSE of trials 0, 1, 2

    def fake_run(out_dir, name, data):
        _, case, seed = name.split("-")
        mse = trials.get(int(case), [0.2, 0.2, 0.2])[int(seed)]
        return {"grna@active": {"mse": mse, "mse_uniform": 0.17 + int(seed) / 100}}

    monkeypatch.setattr(pa, "run_case", fake_run)
    results: dict = {}
    table = pa.ablation_table(tmp_path, pa.datasets(100)["breast_cancer"], [0, 1, 2], 1, results)
    cases = results["ablation"]["cases"]
    for case, values in ((5, trials[5]), (3, trials[3]), (6, [0.17, 0.18, 0.19])):
        row = cases[str(case)]
        assert row["mse"] == pytest.approx(values)
        assert (row["mean"], row["ci95"]) == pytest.approx(pa.mean_ci(values))
    # [0.10, 0.12, 0.11]: s = 0.01, t_{0.975, 2} = 4.302653; half-width 0.024841
    assert cases["5"]["ci95"] == pytest.approx(0.024841, abs=1e-6)
    paired = cases["3"]["minus_full_grn"]  # differences -0.01, -0.02, 0.0
    assert (paired["mean"], paired["ci95"]) == pytest.approx(pa.mean_ci([-0.01, -0.02, 0.0]))
    assert "| 5 | full GRN | 0.1100 ± 0.0248 | - | 0.1216 |" in table
    assert results["ablation"]["trials"] == 3
