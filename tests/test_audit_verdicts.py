"""Issue 56: what each attack needs of the model (one declaration, used by the audit's selection and by
the config check), honest baselines (the majority class), blind rows, failed scoring, the permuted-label
null and `--vary`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import base_config
from tests.headless import assert_not_blank, render
from vflnet.config import ConfigError
from vflnet.threat.attack import LabelAttack, label_scores
from vflnet.tools.audit import cli
from vflnet.tools.audit.execute import BLIND, judge
from vflnet.validation import config_from_dict

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "configs" / "digits-2p.yaml"
BATCH_LABEL = ("analytic-label-recovery", "gradient-inversion-label-inference", "direct-label-inference")


def test_label_attacks_behind_a_top_model_are_not_selected_and_refused_by_config_check() -> None:
    _, _, cands = cli.prepare(DIGITS, [], "quick")  # as written: concatenated embeddings, a top model
    picked = {c.key: c for c in cands}
    for name in BATCH_LABEL:
        cand = picked[f"{name}@passive-1"]
        assert not cand.applies and "summed at the active party" in cand.reason, (name, cand.reason)
    data = base_config(n_passive=2)  # concat under an mlp top
    for name in BATCH_LABEL:
        data["attacks"] = [{"name": name, "party": "passive-1"}]
        with pytest.raises(ConfigError) as info:
            config_from_dict(data)
        assert info.value.key == "protocol.aggregation" and "'concat'" in info.value.message
        assert f"attack {name!r}: needs passive parties that send logits summed" in info.value.message
    # summed logits under a top model: the key that is wrong is the top model's
    data = base_config(n_passive=2, aggregation="sum")
    data["model"] = {"top": {"kind": "mlp", "hidden": [8]}}
    data["attacks"] = [{"name": "analytic-label-recovery", "party": "passive-1"}]
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.key == "model.top.kind"
    # paper 004's setting: selected
    data = base_config(n_passive=2, aggregation="sum")
    data["attacks"] = [{"name": n, "party": "passive-1"} for n in BATCH_LABEL]
    assert [a.name for a in config_from_dict(data).attacks] == list(BATCH_LABEL)


def test_a_model_need_that_does_not_exist_is_refused_when_the_attack_is_defined() -> None:
    with pytest.raises(TypeError, match="no-such-need"):

        class _Wrong(LabelAttack):  # noqa: F841 - defining it is the test
            model_needs = ("no-such-need",)


def test_the_majority_class_baseline_on_an_imbalanced_set() -> None:
    from vflnet.data.datasets import load_dataset

    data = load_dataset("breast_cancer", {})
    truth = dict(zip(data.ids.tolist(), data.labels.tolist(), strict=True))
    majority = int(np.bincount(data.labels).argmax())
    ids = data.ids
    always = label_scores(ids, np.full(len(ids), majority), truth)  # the trivial attacker
    assert always["majority_baseline"] == pytest.approx(0.627, abs=0.001) and always["chance"] == 0.5
    assert always["label_accuracy"] == always["majority_baseline"]
    row: dict[str, Any] = {"scores": [always, always], "errors": []}
    judge(row, 2)
    assert row["baseline"] == pytest.approx(0.627, abs=0.001) and row["verdict"] == "at baseline"
    assert "majority class (1)" in row["baseline_what"]


def test_labels_outside_the_task_are_a_failure_never_a_score() -> None:
    truth = {i: i % 10 for i in range(100)}
    with pytest.raises(ValueError, match="outside the task's classes 0..9"):
        label_scores(np.arange(5), np.array([0, 3, 31, 2, 1]), truth)  # embedding units, not classes
    row: dict[str, Any] = {
        "scores": [label_scores(np.arange(5), np.arange(5), truth)],
        "errors": ["scoring failed: ValueError: inferred labels span 0..31"],
    }
    judge(row, 10)
    assert row["verdict"].startswith("failed: scoring failed") and "mean" not in row


def test_a_blind_attack_is_never_inconclusive() -> None:
    truth = {i: i % 10 for i in range(100)}
    rng = np.random.default_rng(0)
    scores = []
    for _ in range(2):  # two seeds of guesses: few samples, a wide interval
        s = label_scores(np.arange(20), rng.integers(0, 10, 20), truth)
        scores.append(s | {"informed_fraction": 0.0})
    row: dict[str, Any] = {"scores": scores, "errors": []}
    judge(row, 10)
    assert row["verdict"].startswith(BLIND) and "inconclusive" not in row["verdict"]
    informed = {"scores": [s | {"informed_fraction": 1.0} for s in scores], "errors": []}
    judge(informed, 10)
    assert not informed["verdict"].startswith(BLIND)


def test_no_leakage_metric_row_says_so() -> None:
    row: dict[str, Any] = {"scores": [{"codes": 3.0}], "errors": []}
    judge(row, 10)
    assert row["verdict"] == "no leakage metric in its scores: codes=3"


def test_permute_labels_removes_the_secret_at_the_data_level_the_same_in_every_process() -> None:
    from vflnet.data.partition import party_view

    data = base_config(n_passive=2, aggregation="sum")
    plain = party_view(config_from_dict(data), "active")
    data["data"]["permute_labels"] = 3
    cfg = config_from_dict(data)
    permuted, again = party_view(cfg, "active"), party_view(cfg, "active")
    assert (permuted.ids == plain.ids).all() and (permuted.y == again.y).all()  # seeded: every process
    assert sorted(permuted.y.tolist()) == sorted(plain.y.tolist())  # among the samples: the same prior
    assert (permuted.y == plain.y).mean() < 0.3  # 10 classes: about 1 in 10 keeps its label
    passive = party_view(cfg, "passive-1")
    assert (
        passive.y is None
        and (passive.x == party_view(config_from_dict(base_config(2, "sum")), "passive-1").x).all()
    )
    data["data"]["permute_labels"] = "x"
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.key == "data.permute_labels"


def audit(out: Path, *args: str) -> dict[str, Any]:
    import json

    assert cli.main([str(DIGITS), "--quick", "--out", str(out), *args]) == 0
    return json.loads((out / "audit.json").read_text())


SUM = [
    "protocol.aggregation=sum",
    "model.top={kind: none}",
    "parties[2].bottom.out=10",
    "parties[3].bottom.out=10",
    "transport.bridge=loopback",
]


def row(result: dict[str, Any], attack: str, position: str, setting: str = "none") -> dict[str, Any]:
    for r in result["applicable"]:
        if r["attack"] == attack and r["position"] == position:
            return r["by_setting"][setting]
    raise AssertionError(f"no row {attack} @ {position}")


@pytest.mark.slow  # real runs (loopback): about a minute on a loaded 2-core machine
def test_the_null_run_moves_with_the_secret_removed(tmp_path: Path) -> None:
    """A permuted-label run of direct label inference reads the permuted labels off the gradients: against
    the true labels it scores near the majority baseline, and the real run is tested against it."""
    result = audit(tmp_path / "null", "--seeds", "1", "--null", *SUM, "train.max_steps=4")
    direct = row(result, "direct-label-inference", "passive party passive-1")
    assert direct["mean"] > 0.99 and direct["verdict"] == "leaks"
    assert abs(direct["null_mean"] - direct["baseline"]) < 0.06  # the secret removed: a trivial attacker's
    assert direct["test"].startswith("Fisher") and direct["p_value"] < 1e-6 and direct["p_holm"] < 0.05
    assert direct["p_holm"] >= direct["p_value"]
    runs = [r["name"] for r in result["runs"]]
    assert any("-null-labels-taps-" in n for n in runs)


def test_the_low_fpr_and_epsilon_figures_of_a_row() -> None:
    from vflnet.tools.audit.execute import auditing_figures

    rng = np.random.default_rng(0)
    positive = rng.random(400) < 0.3
    scores = positive * 2.0 + rng.normal(0, 1, 400)
    seeds = [
        {"scores": scores[:200].tolist(), "positive": positive[:200].tolist(), "confusion": [0, 100, 0, 100]},
        {"scores": scores[200:].tolist(), "positive": positive[200:].tolist(), "confusion": [0, 100, 0, 100]},
    ]
    figures = auditing_figures(seeds)
    assert figures["roc"]["positives"] == int(positive.sum()) and figures["roc"]["fpr"][0] == 0.0
    at1 = figures["tpr_at_fpr"]["0.01"]
    assert at1["low"] <= at1["tpr"] <= at1["high"] and 0 < at1["tpr"] < 1
    assert figures["tpr_at_fpr"]["0.001"]["tpr"] <= at1["tpr"]
    # no error on 200 positives and 200 negatives, pooled over the seeds
    bound = 1 - 0.025 ** (1 / 200)
    assert figures["epsilon_lower_bound"]["epsilon"] == pytest.approx(np.log((1 - bound) / bound))
    assert auditing_figures([{}]) == {}


def test_vary_values_are_parsed_and_refused_by_name() -> None:
    assert cli.parse_vary(["train.batch_size=32,64", "parties[2].bottom.hidden=[8, 4],[16]"]) == [
        ("train.batch_size", ["32", "64"]),
        ("parties[2].bottom.hidden", ["[8, 4]", "[16]"]),
    ]
    for bad in (["train.batch_size=32"], ["=1,2"], ["x=1,2", "x=3,4"]):
        with pytest.raises(ConfigError):
            cli.parse_vary(bad)


@pytest.mark.slow  # five tiny audits over the loopback bridge and Chromium: about two minutes here
def test_vary_on_two_axes(tmp_path: Path) -> None:
    import json

    out = tmp_path / "vary"
    args = [str(ROOT / "configs" / "scoring-cancer.yaml"), "attacks=[]", "transport.bridge=loopback"]
    args += ["train.max_steps=3", "--quick", "--seeds", "1", "--out", str(out)]
    args += ["--vary", "train.batch_size=32,64", "--vary", "parties[2].bottom.hidden=[8],[16]"]
    assert cli.main(args) == 0
    result = json.loads((out / "audit.json").read_text())
    assert list(result["vary"]) == ["train.batch_size", "parties[2].bottom.hidden"]
    for key, values in (("train.batch_size", ["32", "64"]), ("parties[2].bottom.hidden", ["[8]", "[16]"])):
        axis = result["vary"][key]
        assert axis["values"] == values and not any(axis["refused"])
        assert all(isinstance(a, float) for a in axis["test_accuracy"])
        direct = axis["rows"]["direct-label-inference @ passive party passive-1"]
        assert direct["metric"] == "label_accuracy" and all(m is not None for m in direct["means"])
        for audit_dir in axis["audits"]:  # each value is a whole audit of its own
            assert (Path(audit_dir) / "audit.json").exists()
    # each value's audit ran its own setting: the batch size of its runs' configs
    for value, audit_dir in zip(["32", "64"], result["vary"]["train.batch_size"]["audits"], strict=True):
        configs = list((Path(audit_dir) / "configs").glob("*.yaml"))
        assert configs and all(f"batch_size: {value}" in c.read_text() for c in configs)
    md = (out / "audit.md").read_text()
    assert "## Along train.batch_size" in md and "## Along parties[2].bottom.hidden" in md
    assert (out / "audit_files" / "vary-train.batch_size.png").stat().st_size > 0
    # the self-contained page, as Chromium draws it: the axes' sections, the ROC and the curves
    shown = render(out / "audit.html", tmp_path)
    assert_not_blank(shown.screenshot)
    for heading in ("Verdicts", "Low-FPR and epsilon figures", "Along train.batch_size"):
        assert f"<h2>{heading}</h2>" in shown.dom
    images = shown.sizes("img")
    assert len(images) >= 3 and all(w > 0 and h > 0 for w, h in images)  # a ROC and two axes' plots


def test_vflnet_config_check_refuses_a_batch_label_attack_behind_a_top_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vflnet.cli import main as vflnet_main

    attack = "attacks=[{name: analytic-label-recovery, party: passive-1}]"
    assert vflnet_main(["config", "check", str(DIGITS), attack]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "protocol.aggregation" in err and "summed at the active party" in err, err


def test_resample_features_draws_each_passive_column_from_its_marginal_and_scoring_keeps_the_truth() -> None:
    from vflnet.data.partition import party_view
    from vflnet.runner.scoring import ground_truth

    data = base_config(n_passive=2, aggregation="sum")
    plain_cfg = config_from_dict(data)
    data["data"]["resample_features"] = 5
    cfg = config_from_dict(data)
    plain, drawn = party_view(plain_cfg, "passive-1"), party_view(cfg, "passive-1")
    assert drawn.x is not None and plain.x is not None and (drawn.ids == plain.ids).all()
    assert (drawn.x == party_view(cfg, "passive-1").x).all()  # seeded: the same in every process
    flat, flat0 = drawn.x.reshape(len(drawn.x), -1), plain.x.reshape(len(plain.x), -1)
    assert (np.sort(flat, axis=0) == np.sort(flat0, axis=0)).all()  # each column: the same marginal
    assert (flat != flat0).any(axis=1).mean() > 0.9  # but hardly a row as it was
    assert (party_view(cfg, "active").y == party_view(plain_cfg, "active").y).all()  # labels untouched
    truth = ground_truth(cfg, "features")  # scoring compares with the true features
    assert (truth["passive-1"][1] == party_view(cfg, "passive-1", as_trained=False).x).all()


@pytest.mark.slow  # one small audit over the loopback bridge: about a minute here
def test_the_feature_null_tests_esa_against_marginal_draws(tmp_path: Path) -> None:
    """ESA solves logistic regression's equations exactly; on features drawn from their marginals it
    recovers the draws, not the truth: its null is the marginal's error, and the row leaks against it."""
    import json

    out = tmp_path / "esa"
    args = [str(ROOT / "configs" / "esa-synthetic.yaml"), "attacks=[]", "model_release=[]"]
    args += ["transport.bridge=loopback", "--quick", "--seeds", "1", "--null", "--out", str(out)]
    assert cli.main(args) == 0
    result = json.loads((out / "audit.json").read_text())
    esa = row(result, "esa", "active party active")
    assert esa["metric"] == "mse" and esa["mean"] < 1e-6 and esa["verdict"] == "leaks"
    assert esa["null_mean"] > esa["baseline"]  # marginal draws: about twice the best constant's error
    assert esa["test"].startswith("Mann-Whitney") and esa["p_holm"] < 0.05
    groups = {r["group"] for r in result["runs"]}
    assert {"taps", "null:labels:taps", "null:features:taps"} <= groups
