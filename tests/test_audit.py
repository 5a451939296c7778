"""`vflnet audit`: attack selection derived from the contracts (one test per selection of issue 37), real
quick audits over the loopback bridge (split: the direct label inference leaks; split-he: it is at
chance), a defense's trade-off row, resuming, and the report in headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.headless import assert_not_blank, render
from vflnet.config import ConfigError
from vflnet.tools.audit import cli
from vflnet.tools.audit.selection import Candidate

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "configs" / "digits-2p.yaml"
# digits-2p with summed logits (paper 004's setting): each passive party's bottom gives 10 logits
SUM = [
    "protocol.aggregation=sum",
    "model.top={kind: none}",  # the whole block: mlp's hidden would not be read by kind none
    "parties[2].bottom.out=10",
    "parties[3].bottom.out=10",
]
FAST = ["transport.bridge=loopback"]


def selection(config: Path, *overrides: str) -> dict[str, Candidate]:
    _, _, cands = cli.prepare(config, list(overrides), "quick")
    return {c.key: c for c in cands}


def test_split_plaintext_selection_and_the_reasons_of_the_rest() -> None:
    picked = selection(DIGITS, *SUM)
    for key in (
        "direct-label-inference@passive-1",
        "direct-label-inference@mitm:passive-1",  # plaintext transport: an observer of the channel
        "analytic-label-recovery@passive-2",
        "passive-model-completion@passive-1",
    ):
        assert picked[key].applies, (key, picked[key].reason)
    oracle = picked["decryption-oracle@passive-1"]
    assert not oracle.applies and "Decrypt" in oracle.reason and "'split' never sends" in oracle.reason
    cafe = picked["cafe@coordinator"]
    assert not cafe.applies and "architecture" in cafe.reason and "param-server" in cafe.reason
    assert "binary tasks" in picked["direction-scoring@passive-1"].reason  # refused as its party builds it
    # the config as written (concatenated embeddings and a top model): Lemma 1 has no class gradient to read
    plain = selection(DIGITS)
    direct = plain["direct-label-inference@passive-1"]
    assert not direct.applies and "protocol.aggregation" in direct.reason and "'concat'" in direct.reason
    fr = plain["feature-reconstruction@active"]
    assert not fr.applies and "input-layer cut" in fr.reason


def test_an_attack_whose_knowledge_is_missing_is_skipped_with_the_reason() -> None:
    esa = selection(DIGITS, *SUM)["esa@active"]
    assert not esa.applies
    assert esa.reason.startswith("needs predictions")
    assert "the run has no prediction phase (predict.set: none)" in esa.reason


def test_split_he_selection() -> None:
    picked = selection(DIGITS, *SUM, "protocol.kind=split-he")
    for key in (
        "decryption-oracle@passive-1",
        "direct-label-inference@passive-1",
        "analytic-label-recovery@passive-1",
    ):
        assert picked[key].applies, (key, picked[key].reason)
    assert [k for k, s, _ in picked["decryption-oracle@passive-1"].knowledge] == ["public_key"]


def test_param_server_selects_cafe() -> None:
    cafe = selection(ROOT / "configs" / "cafe-digits.yaml", "attacks=[]")["cafe@coordinator"]
    assert cafe.applies, cafe.reason
    assert {k for k, _, _ in cafe.knowledge} >= {"architecture", "train_ids"}
    assert cafe.position == "the coordinator"


def test_an_input_layer_cut_selects_feature_reconstruction() -> None:
    picked = selection(ROOT / "configs" / "feature-reconstruction.yaml", "attacks=[]")
    assert picked["feature-reconstruction@active"].applies, picked["feature-reconstruction@active"].reason
    assert picked["feature-reconstruction@mitm:active"].applies


def test_logistic_regression_with_a_prediction_phase_selects_esa() -> None:
    esa_config = ROOT / "configs" / "esa-synthetic.yaml"
    esa = selection(esa_config, "attacks=[]", "model_release=[]")["esa@active"]
    assert esa.applies, esa.reason
    standing = {k: s for k, _, s in esa.knowledge}
    assert standing["released_model"].startswith("granted")  # the audit's assumption, listed in the report
    assert esa.grants == [{"owner": "passive-1", "recipient": "active", "modules": ["bottom"], "when": "end"}]
    without = selection(esa_config, "attacks=[]", "predict={set: none}")["esa@active"]
    assert not without.applies and "no prediction phase" in without.reason
    # a prediction phase but MLP bottoms: no logistic regression to solve
    mlp = selection(DIGITS, *SUM, "predict.set=test")
    assert not mlp["esa@active"].applies and "logistic regression" in mlp["esa@active"].reason
    assert mlp["grna@active"].applies  # GRNA takes any released model
    assert "secureboost" in mlp["pra@active"].reason


def test_tls_rules_out_the_man_in_the_middle(tmp_path: Path) -> None:
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("")
    picked = selection(
        DIGITS,
        *SUM,
        "transport.tls.enabled=true",
        f"transport.tls.ca={tmp_path / 'ca.pem'}",
        f"transport.tls.cert={tmp_path / 'cert.pem'}",
        f"transport.tls.key={tmp_path / 'key.pem'}",
    )
    mitm = picked["direct-label-inference@mitm:passive-1"]
    assert not mitm.applies and "transport.tls is on" in mitm.reason
    assert picked["direct-label-inference@passive-1"].applies


def test_a_config_that_lists_attacks_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="attacks"):
        cli.prepare(ROOT / "configs" / "label-leak.yaml", [], "quick")


def audit(out: Path, *args: str) -> dict[str, Any]:
    assert cli.main([str(DIGITS), "--quick", "--out", str(out), *args]) == 0
    return json.loads((out / "audit.json").read_text())


def row(result: dict[str, Any], attack: str, position: str, setting: str = "none") -> dict[str, Any]:
    for r in result["applicable"]:
        if r["attack"] == attack and r["position"] == position:
            return r["by_setting"][setting] | {"reproduce": r["reproduce"], "threat_model": r["threat_model"]}
    raise AssertionError(f"no row {attack} @ {position}")


@pytest.fixture(scope="module")
def split_audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit") / "split"
    audit(out, *SUM, *FAST, "train.max_steps=8")
    return out


@pytest.mark.slow  # real runs (loopback): about a minute each on a loaded 2-core machine
def test_split_audit_the_direct_label_inference_leaks(split_audit: Path) -> None:
    result = json.loads((split_audit / "audit.json").read_text())
    direct = row(result, "direct-label-inference", "passive party passive-1")
    assert direct["verdict"] == "leaks"
    assert (
        direct["metric"] == "label_accuracy"
        and direct["mean"] > 0.99
        and direct["baseline"] == pytest.approx(0.1)
    )
    assert direct["seeds"] == [0, 1] and len(direct["values"]) == 2
    assert direct["threat_model"].startswith(
        "Passive party passive-1 sees the ExchangeEmbeddings requests it sends"
    )
    mitm = row(result, "direct-label-inference", "a man in the middle on passive-1's channel")
    assert mitm["verdict"] == "leaks" and mitm["values"] == direct["values"]  # offline over the trace
    assert mitm["reproduce"].startswith("vflnet attack direct-label-inference --trace ")
    # the row's own command: a config with that attack alone
    command = direct["reproduce"].split()
    assert command[:2] == ["vflnet", "run"]
    alone = yaml.safe_load(Path(command[2]).read_text())
    assert alone["attacks"] == [{"name": "direct-label-inference", "party": "passive-1", "params": {}}]
    # the backdoor's baseline: the same triggered samples in the same seed's run without it
    backdoor = row(result, "backdoor", "passive party passive-2")
    assert backdoor["metric"] == "asr" and len(backdoor["values"]) == 2
    assert backdoor["baseline"] == pytest.approx(
        sum(s["asr_without_attack"] * s["triggered_test"] for s in backdoor["scores"])
        / sum(s["triggered_test"] for s in backdoor["scores"])
    )
    skipped = {(s["attack"], s["party"]): s["reason"] for s in result["skipped"]}
    assert "no prediction phase" in skipped[("esa", "active")]
    md = (split_audit / "audit.md").read_text()
    assert "## Verdicts" in md and "## Not applicable" in md and "paper 004" in md


@pytest.mark.slow  # real runs (loopback): about a minute each on a loaded 2-core machine
def test_a_defense_adds_its_trade_off_row(tmp_path: Path) -> None:
    result = audit(
        tmp_path / "dp",
        "--seeds",
        "1",
        "--defenses",
        "dp-gaussian,fake-gradients",
        *SUM,
        *FAST,
        "train.max_steps=8",
    )
    names = [s["name"] for s in result["settings"]]
    assert names == ["none", "dp-gaussian", "fake-gradients"]
    assert result["settings"][1]["defenses"] == [{"name": "dp-gaussian", "party": "active", "params": {}}]
    assert "param-server" in result["settings"][2]["not_applicable"]  # an upload defense: split has no upload
    for setting in ("none", "dp-gaussian"):
        u = result["utility"][setting]
        assert (
            len(u["test_accuracy"]) == 1
            and 0.0 <= u["mean_test_accuracy"] <= 1.0
            and u["mean_wall_time_s"] > 0
        )
    assert "fake-gradients" not in result["utility"]
    defended = row(result, "direct-label-inference", "passive party passive-1", "dp-gaussian")
    assert len(defended["values"]) == 1 and defended["mean"] < 1.0
    dcs = result["defense_capability_score"]
    assert set(dcs) == {"none", "dp-gaussian"}
    assert 0.0 < dcs["dp-gaussian"]["direct-label-inference@passive-1"] <= 1.0
    assert "## Defenses: utility and leakage" in (tmp_path / "dp" / "audit.md").read_text()


@pytest.mark.slow  # real runs (loopback): about a minute each on a loaded 2-core machine
def test_an_audit_resumes_without_running_again(
    split_audit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = sorted((split_audit / "runs").iterdir())
    stamps = {p: (p / "summary.json").stat().st_mtime_ns for p in runs if (p / "summary.json").exists()}
    before = json.loads((split_audit / "audit.json").read_text())
    after = audit(split_audit, *SUM, *FAST, "train.max_steps=8")
    assert "running" not in capsys.readouterr().err
    assert stamps == {p: (p / "summary.json").stat().st_mtime_ns for p in stamps}
    assert after["applicable"] == before["applicable"]


@pytest.mark.slow  # real runs (loopback): about a minute each on a loaded 2-core machine
def test_split_he_audit_direct_at_chance(tmp_path: Path) -> None:
    he = [
        "protocol.kind=split-he",
        "protocol.params.key_bits=512",
        "protocol.params.allow_insecure_keys=true",
    ]
    result = audit(tmp_path / "he", *SUM, *FAST, *he, "train.max_steps=3", "train.batch_size=32")
    direct = row(result, "direct-label-inference", "passive party passive-1")
    # encrypted per-sample gradients: it could only guess, and the row says so (issue 56: never a verdict)
    assert direct["verdict"].startswith("blind: no informed sample") and direct["mean"] < 0.3
    assert all(s["informed_fraction"] == 0.0 for s in direct["scores"])
    analytic = row(result, "analytic-label-recovery", "passive party passive-1")
    assert analytic["metric"] == "label_accuracy" and len(analytic["values"]) == 2  # scored
    # the coordinator's checks do not refuse it: within its one array per step it reads every label
    oracle = row(result, "decryption-oracle", "passive party passive-1")
    assert oracle["verdict"] == "leaks" and oracle["mean"] == 1.0


@pytest.mark.slow  # Chromium's start takes over a minute on a loaded machine
def test_the_report_renders_in_headless_chromium(split_audit: Path, tmp_path: Path) -> None:
    shown = render(split_audit / "audit.html", tmp_path)
    assert shown.screenshot.stat().st_size > 0
    assert_not_blank(shown.screenshot)
    assert "<h2>Verdicts</h2>" in shown.dom and "<h2>Not applicable</h2>" in shown.dom
    assert "<td>leaks</td>" in shown.dom
    tables = shown.sizes("table")
    assert len(tables) >= 3 and all(w > 0 and h > 0 for w, h in tables)


def test_a_defense_settings_file_and_its_refusals(tmp_path: Path) -> None:
    from vflnet.tools.audit.execute import defense_settings

    base, cfg, _ = cli.prepare(DIGITS, SUM, "quick")
    good = tmp_path / "defenses.yaml"
    good.write_text(
        "dp-weak: [{name: dp-gaussian, params: {scale: 0.001}}]\n"
        "noise: [{name: embedding-noise, params: {sigma: 0.1}}]\n"
        "upload: [{name: fake-gradients}]\n"
        "binary: [{name: marvell}]\n"
    )
    settings = {s.name: s for s in defense_settings(str(good), cfg, base, 10)}
    assert settings["dp-weak"].defenses == [
        {"name": "dp-gaussian", "party": "active", "params": {"scale": 0.001}}
    ]
    assert [d["party"] for d in settings["noise"].defenses] == ["passive-1", "passive-2"]
    assert not settings["dp-weak"].reason and not settings["noise"].reason
    assert "upload" in settings["upload"].reason  # split applies no upload defense: not applicable, why
    assert "binary tasks" in settings["binary"].reason  # refused as the active party builds it
    for text, key in (
        ("x: [{name: dp-gaussian, strength: 1}]\n", "x[0]"),
        ("x: [{name: no-such-defense}]\n", "x[0].name"),
        ("none: [{name: dp-gaussian}]\n", "none"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError) as info:
            defense_settings(str(bad), cfg, base, 10)
        assert info.value.key == key and info.value.source == str(bad)


@pytest.mark.slow  # real runs (loopback)
def test_an_audit_of_a_users_csv(tmp_path: Path) -> None:
    """A user's own CSV (binary task, LR parties, a prediction phase): the binary and prediction-phase
    attacks are selected and scored; nothing in the audit is specific to the bundled datasets."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6))
    y = (x[:, 0] + x[:, 3] > 0).astype(int)
    csv = tmp_path / "mine.csv"
    csv.write_text(
        "a,b,c,d,e,f,label\n"
        + "".join(",".join(f"{v:.4f}" for v in r) + f",{t}\n" for r, t in zip(x, y, strict=True))
    )
    config = tmp_path / "mine.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "protocol": {"kind": "split", "aggregation": "sum"},
                "data": {"dataset": "csv", "params": {"path": str(csv), "label_column": "label"}},
                "parties": [
                    {"name": "coordinator", "role": "coordinator"},
                    {
                        "name": "active",
                        "role": "active",
                        "features": {"columns": "0:3"},
                        "bottom": {"kind": "linear", "out": 2},
                    },
                    {
                        "name": "passive-1",
                        "role": "passive",
                        "features": {"columns": "3:6"},
                        "bottom": {"kind": "linear", "out": 2},
                    },
                ],
                "model": {"top": {"kind": "none"}},
                "train": {"epochs": 2, "batch_size": 32},
                "predict": {"set": "test"},
                "transport": {"bridge": "loopback"},
            }
        )
    )
    assert cli.main([str(config), "--quick", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "audit.json").read_text())
    direction = row(result, "direction-scoring", "passive party passive-1")
    assert direction["metric"] == "auc" and direction["verdict"] == "leaks"
    esa = row(result, "esa", "active party active")
    assert esa["metric"] == "mse" and esa["mean"] < esa["baseline"]
    assert {s["attack"] for s in result["skipped"]} >= {"backdoor", "cafe", "pra"}
