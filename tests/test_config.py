import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, base_config, write_config
from vflnet.config import ConfigError
from vflnet.validation import config_from_dict, load_config


def _err(tmp_path, data) -> ConfigError:
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)  # every error names the file
    return info.value


def test_default_config_is_valid(repo):
    cfg = load_config(repo / "configs" / "digits-2p.yaml")
    assert [p.role for p in cfg.parties] == ["coordinator", "active", "passive", "passive"]


def test_unknown_key_is_named_with_the_allowed_keys(tmp_path):
    data = base_config()
    data["train"]["learning_rate"] = 0.1
    err = _err(tmp_path, data)
    assert err.key == "train.learning_rate" and "unknown key" in err.message and "optimizer" in err.message


def test_wrong_type_names_the_key_and_the_expected_type(tmp_path):
    data = base_config()
    data["train"]["optimizer"]["lr"] = "fast"
    err = _err(tmp_path, data)
    assert err.key == "train.optimizer.lr" and "expected a number" in err.message


def test_wrong_literal_lists_the_choices(tmp_path):
    data = base_config()
    data["protocol"]["aggregation"] = "mean"
    err = _err(tmp_path, data)
    assert err.key == "protocol.aggregation" and "'concat'" in err.message and "'sum'" in err.message


@pytest.mark.parametrize(
    "change, key, text",
    [
        (lambda d: d["parties"].append(dict(d["parties"][2])), "parties[4].name", "duplicate"),
        (lambda d: d["parties"].pop(0), "parties", "exactly one coordinator"),
        (lambda d: d["parties"][2].pop("features"), "parties[2].features", "needs features"),
        (lambda d: d["parties"][2]["bottom"].update(out=0), "parties[2].bottom.out", "embedding size"),
        (
            lambda d: d["parties"][2]["features"].update(region=[0, 8, 0, 12]),
            "parties[2].features",
            "outside the 8x8",
        ),
        (
            lambda d: d["parties"][2]["features"].update(region=None, columns="0:99"),
            "parties[2].features",
            "columns must lie",
        ),
        (lambda d: d["data"].update(dataset="cifar10"), "data.dataset", "unknown dataset"),
        (lambda d: d["train"].update(batch_size=0), "train.batch_size", "positive"),
        (lambda d: d["protocol"].update(aggregation="sum"), "protocol.aggregation", "equal bottom output"),
        (
            lambda d: d["parties"][2]["bottom"].update(output_activation="softmax"),
            "parties[2].bottom.output_activation",
            "top model only",
        ),
        (
            lambda d: d["parties"][3]["bottom"].update(input_activation="relu"),
            "parties[3].bottom.input_activation",
            "top model only",
        ),
        (lambda d: d["parties"][2]["bottom"].update(init="xavier"), "parties[2].bottom.init", "keras"),
    ],
)
def test_semantic_errors_name_the_key(tmp_path, change, key, text):
    data = base_config(n_passive=2)
    if "equal bottom" in text:
        data["parties"][3]["bottom"]["out"] = 8
    change(data)
    err = _err(tmp_path, data)
    assert err.key == key and text in err.message


def test_top_none_needs_class_count(tmp_path):
    data = base_config(aggregation="sum")
    for p in data["parties"][2:]:
        p["bottom"]["out"] = 7
    err = _err(tmp_path, data)
    assert err.key == "model.top.kind" and "number of classes" in err.message


def test_not_a_mapping_and_bad_yaml(tmp_path):
    (tmp_path / "a.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("run: {id: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "b.yaml")


def test_round_trip_through_dump(tmp_path):
    cfg = config_from_dict(base_config(n_passive=3))
    again = config_from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.e2e
def test_cli_config_check_exit_codes(tmp_path, repo):
    ok = subprocess.run(
        [sys.executable, "-m", "vflnet", "config", "check", str(repo / "configs/digits-2p.yaml")],
        capture_output=True,
        text=True,
        cwd=repo,
    )
    assert ok.returncode == 0 and "OK" in ok.stdout
    data = base_config()
    data["parties"][2]["bottom"]["kind"] = "transformer"
    path = write_config(tmp_path, data)
    bad = subprocess.run(
        [sys.executable, "-m", "vflnet", "config", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=repo,
    )
    assert bad.returncode == 2
    assert f"{path}: key 'parties[2].bottom.kind'" in bad.stderr and "'mlp'" in bad.stderr


def _run_configs() -> list[Path]:
    """Every vflnet run config in the repository: configs/ and the deployments' own (k8s, lab)."""
    found = sorted(REPO.glob("configs/*.yaml"))
    for path in sorted(REPO.glob("deploy/**/*.yaml")):
        docs = list(yaml.safe_load_all(path.read_text()))  # Kubernetes manifests hold several
        if len(docs) == 1 and isinstance(docs[0], dict) and {"parties", "protocol"} <= docs[0].keys():
            found.append(path)
    return found


def test_run_configs_are_found():
    names = [str(p.relative_to(REPO)) for p in _run_configs()]
    assert "configs/scoring-cancer.yaml" in names and "deploy/k8s/config/run.yaml" in names
    assert "deploy/lab/run.yaml" in names and "deploy/k8s/parties.yaml" not in names


@pytest.mark.parametrize("path", _run_configs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_passes_config_check(path, tmp_path, monkeypatch):
    """What `vflnet config check` does, from an empty directory: nothing a script writes may be needed."""
    monkeypatch.chdir(tmp_path)
    load_config(path)
