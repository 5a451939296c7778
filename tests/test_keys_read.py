"""Every key a user sets is read, or refused (issue 55, point 1): the mechanism, not a list of cases.

Every field of the schema declares its readers (``vflnet.config.setting(reads=...)``); the keys a
file or the command line set are judged against those declarations and the components' own
(`ModelKind.reads`, `Protocol.train_reads`, `Protocol.settings`, `Param.when`)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import base_config, write_config

from vflnet.config import Config, ConfigError, Reads, TrainConfig, unread_keys
from vflnet.models.zoo import MODEL_KEYS
from vflnet.registry import MODELS, PROTOCOLS
from vflnet.validation import config_from_dict, load_config

REPO = Path(__file__).resolve().parents[1]
SECUREBOOST = yaml.safe_load((REPO / "configs" / "secureboost-digits.yaml").read_text())


def _section(tp: Any) -> Any:
    """The section dataclass a field's type holds (itself, in an Optional or a list), or None."""
    if dataclasses.is_dataclass(tp):
        return tp
    return next((s for arg in typing.get_args(tp) if (s := _section(arg)) is not None), None)


def _schema_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field[Any]]]:
    """Every settable field reachable from ``cls`` (through Optional and list items), as dotted keys."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}{f.name}"
        found.append((key, f))
        section = _section(hints[f.name])
        if section is not None:
            listed = typing.get_origin(hints[f.name]) is list
            found += _schema_fields(section, f"{key}{'[i]' if listed else ''}.")
    return found


def test_every_settable_key_of_the_schema_declares_its_readers():
    fields = _schema_fields(Config)
    keys = {k for k, _ in fields}
    # the walk reaches every depth, list items included
    assert {"train.optimizer.momentum", "parties[i].bottom.channels", "attacks[i].params"} <= keys
    assert {"transport.tls.ca", "model.top.input_activation", "model_release[i].modules"} <= keys
    undeclared = [k for k, f in fields if not isinstance(f.metadata.get("reads"), Reads)]
    assert undeclared == []


def test_every_model_kind_reads_only_model_block_keys_and_the_train_keys_are_declared():
    assert {"hidden", "channels", "dropout", "shift", "bias", "activation", "init"} <= MODEL_KEYS
    for name, kind in MODELS.all().items():
        assert kind.reads <= MODEL_KEYS, name
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    for name, protocol in PROTOCOLS.all().items():
        assert protocol.train_reads <= train_keys, name
    assert "optimizer" not in PROTOCOLS.get("secureboost").train_reads


def test_a_model_kind_that_declares_a_key_outside_the_block_is_refused_when_it_is_made():
    from vflnet.models.zoo import ModelKind

    with pytest.raises(ValueError, match="not model block keys"):
        ModelKind("typo", "x", reads=frozenset({"hiden"}))


def _refused(data: dict[str, Any], tmp_path: Path, overrides: tuple[str, ...] = ()) -> ConfigError:
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_config(path, check_data=False, overrides=overrides)
    assert str(path) in err.value.source or overrides
    return err.value


SGD = {"kind": "sgd", "lr": 0.1}


@pytest.mark.parametrize(
    ("change", "key", "text"),
    [
        (
            lambda d: d["train"].update(optimizer={**SGD, "momentum": 0.9}),
            "train.optimizer.momentum",
            "'momentum'",
        ),
        (
            lambda d: d["train"].update(optimizer={**SGD, "betas": [0.9, 0.99]}),
            "train.optimizer.betas",
            "'adam'",
        ),
        (lambda d: d["train"].update(lr_schedule={"gamma": 0.5}), "train.lr_schedule.gamma", "'step'"),
        (lambda d: d.update(predict={"batch_size": 32}), "predict.batch_size", "'test' or 'train'"),
        (lambda d: d["transport"].update(tls={"ca": "ca.pem"}), "transport.tls.ca", "enabled is True"),
        (
            lambda d: d["transport"].update(heartbeat_s=0, dead_after_s=5),
            "transport.dead_after_s",
            "heartbeat",
        ),
        (lambda d: d["parties"][2]["bottom"].update(channels=[4]), "parties[2].bottom.channels", "'cnn'"),
        (lambda d: d["parties"][3]["bottom"].update(shift=2), "parties[3].bottom.shift", "resnet"),
        (lambda d: d["model"]["top"].update(out=10), "model.top.out", "number of classes"),
        (lambda d: d.update(trace={"max_mb": 5}), "trace.max_mb", "trace.parties"),
        (
            lambda d: d["transport"].update(bridge="loopback", tls={"enabled": False}),
            "transport.tls.enabled",
            "no sockets, TLS",
        ),
        (
            lambda d: d["transport"].update(bridge="loopback", heartbeat_s=1),
            "transport.heartbeat_s",
            "'grpc'",
        ),
        (
            lambda d: (d["transport"].update(bridge="loopback"), d["run"].update(auto_resume=2)),
            "run.auto_resume",
            "never resumes",
        ),
        (lambda d: d["parties"][0].update(sample_fraction=0.5), "parties[0].sample_fraction", "coordinator"),
    ],
)
def test_a_set_key_nothing_reads_is_refused_naming_the_key_and_its_reader(tmp_path, change, key, text):
    data = base_config()
    change(data)
    err = _refused(data, tmp_path)
    assert err.key == key and err.message.startswith("not read:") and text in err.message


def test_the_same_keys_are_read_where_their_condition_holds(tmp_path):
    data = base_config()
    data["train"].update(
        optimizer={"kind": "momentum", "lr": 0.1, "momentum": 0.8},
        lr_schedule={"kind": "step", "step_size": 2, "gamma": 0.5},
    )
    data["predict"] = {"set": "test", "batch_size": 32, "count": 10, "when": "end"}
    data["trace"] = {"parties": ["active"], "max_mb": 5}
    cfg = load_config(write_config(tmp_path, data), check_data=False)
    assert cfg.train.optimizer.momentum == 0.8 and unread_keys(cfg) == []


def test_a_key_at_its_default_still_counts_as_set(tmp_path):
    data = base_config()
    data["train"]["optimizer"]["momentum"] = 0.9  # the default, under adam
    assert _refused(data, tmp_path).key == "train.optimizer.momentum"


def test_a_train_key_the_protocol_does_not_read_is_refused(tmp_path):
    data = dict(SECUREBOOST)
    data["train"] = {**data["train"], "optimizer": {"kind": "adam", "lr": 0.1}}
    err = _refused(data, tmp_path)
    assert (
        err.key == "train.optimizer.kind"
        and "protocol 'secureboost' does not read train.optimizer" in err.message
    )
    assert "split" in err.message  # what would read it


def test_an_override_of_an_unread_key_names_the_command_line(tmp_path):
    err = _refused(base_config(), tmp_path, ("train.optimizer.momentum=0.5",))
    assert err.source == "command line (train.optimizer.momentum=0.5)"
    assert err.key == "train.optimizer.momentum"


def test_a_launcher_that_sets_a_key_itself_refuses_it(tmp_path):
    data = base_config()
    data["parties"][2]["address"] = "10.0.0.7:50051"
    path = write_config(tmp_path, data)
    assert load_config(path, check_data=False).party("passive-1").address  # deployments read it
    with pytest.raises(ConfigError) as err:
        load_config(path, check_data=False, launcher="run")
    assert err.value.key == "parties[2].address" and "free loopback port" in err.value.message


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    path = tmp_path / "run.yaml"
    text = yaml.safe_dump(base_config(), sort_keys=False) + "train:\n  epochs: 3\n"
    path.write_text(text)
    first = text.splitlines().index("train:") + 1
    with pytest.raises(ConfigError) as err:
        load_config(path, check_data=False)
    assert err.value.source == str(path)
    assert f"'train' appears twice in one mapping (lines {first} and {len(text.splitlines()) - 1})" in str(
        err.value
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text("run:\n  seed: 1\n  dir: x\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"'seed' appears twice .*lines 2 and 4"):
        load_config(nested, check_data=False)


def test_a_duplicate_key_in_an_override_value_is_refused_naming_the_command_line(tmp_path):
    err = _refused(base_config(), tmp_path, ("train.optimizer={kind: sgd, kind: adam}",))
    assert err.source == "command line" and err.key == "train.optimizer"
    assert "'kind' appears twice" in err.message


def test_a_bad_parameter_names_its_dotted_key(tmp_path):
    data = dict(SECUREBOOST)
    data["protocol"] = {**data["protocol"], "params": {**data["protocol"].get("params", {}), "key_bits": 7}}
    err = _refused(data, tmp_path)
    assert err.key == "protocol.params.key_bits" and "expected an integer >= 256" in err.message


def test_a_parameter_its_condition_says_is_unread_is_refused(tmp_path):
    data = dict(SECUREBOOST)
    params = {**data["protocol"].get("params", {}), "mode": "plain", "key_bits": 2048}
    data["protocol"] = {**data["protocol"], "params": params}
    err = _refused(data, tmp_path)
    assert err.key == "protocol.params.key_bits" and "mode is 'plain'" in err.message


def test_the_resolved_config_leaves_out_what_it_does_not_read_and_parses_back():
    data = base_config()
    cfg = config_from_dict(data)
    plain = cfg.to_dict()
    assert "momentum" not in plain["train"]["optimizer"] and "betas" in plain["train"]["optimizer"]
    assert "ca" not in plain["transport"]["tls"] and "channels" not in plain["parties"][2]["bottom"]
    again = config_from_dict(plain)
    assert again.to_dict() == plain and unread_keys(again) == []


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_sets_only_keys_it_reads(path):
    cfg = load_config(path, check_data=False, launcher=None if "compose" in path.name else "run")
    assert unread_keys(cfg) == []


def test_a_protocols_checked_params_leave_out_the_defaults_it_does_not_read():
    data = dict(SECUREBOOST)
    data["protocol"] = {**data["protocol"], "params": {"mode": "plain", "ensemble": "forest"}}
    cfg = config_from_dict(data)
    assert "key_bits" not in cfg.protocol.params and "learning_rate" not in cfg.protocol.params
    assert config_from_dict(cfg.to_dict()).protocol.params == cfg.protocol.params  # a resolved config.yaml


@pytest.mark.parametrize(
    ("name", "params", "key"),
    [
        ("backdoor", {"hide_poison": False, "noise_std": 2.0}, "noise_std"),
        ("feature-reconstruction", {"phase": "predict", "step": 3}, "step"),
    ],
)
def test_an_attack_parameter_of_another_mode_names_its_dotted_key(name, params, key):
    from vflnet.registry import ATTACKS, ParamError, validate_params

    spec = ATTACKS.get(name).params
    with pytest.raises(ParamError) as err:
        validate_params("attack", name, spec, params)
    assert err.value.key == key and "is set but not read" in str(err.value)
    assert key not in validate_params("attack", name, spec, {k: v for k, v in params.items() if k != key})


def test_a_sweep_file_that_repeats_a_key_is_refused_with_both_lines(tmp_path):
    from vflnet.tools.experiments.plan import load_sweep

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {REPO / 'configs' / 'digits-2p.yaml'}\nseeds: [0]\nseeds: [1]\n")
    with pytest.raises(ConfigError, match=r"'seeds' appears twice in one mapping \(lines 2 and 3\)") as err:
        load_sweep(sweep)
    assert err.value.source == str(sweep)
