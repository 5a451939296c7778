"""One registry pattern (attacks, defenses, datasets, model kinds, protocols), plug-ins registering
into it from a config, config.py standing alone below the validation module, and docs/config.md
generated from the schema."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from torch import nn

from tests.conftest import REPO, base_config, write_config
from vflnet import cli
from vflnet.config import ConfigError
from vflnet.registry import ATTACKS, DATASETS, DEFENSES, MODELS, PROTOCOLS, UnknownName
from vflnet.validation import config_from_dict, load_config


def test_config_imports_nothing_else_from_vflnet():
    code = "import sys; import vflnet.config; print(sorted(m for m in sys.modules if m.startswith('vflnet')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "['vflnet', 'vflnet.config']"


def test_a_registry_scans_its_package_once_refuses_duplicates_and_lists_known_names(tmp_path, monkeypatch):
    pkg = tmp_path / "widgets_for_registry_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from vflnet.registry import Registry\nWIDGETS = Registry('widget', __name__)\nIMPORTED = []\n"
    )
    for shape in ("round", "square"):
        (pkg / f"{shape}.py").write_text(
            f"from widgets_for_registry_test import IMPORTED, WIDGETS\nIMPORTED.append({shape!r})\n\n"
            f"@WIDGETS.register\nclass W:\n    name = {shape!r}\n    description = 'a {shape} widget'\n"
        )
    (pkg / "_private.py").write_text("raise RuntimeError('modules starting with _ are not scanned')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import widgets_for_registry_test as widgets

    registry = widgets.WIDGETS
    assert widgets.IMPORTED == []  # nothing is imported before the first lookup
    assert registry.get("round").description == "a round widget"
    assert registry.names() == ["round", "square"] and "square" in registry
    assert widgets.IMPORTED == ["round", "square"]  # each module once
    with pytest.raises(UnknownName, match="unknown widget 'hex'; known: round, square"):
        registry.get("hex")
    assert registry.register(registry.get("round")) is registry.get("round")  # the same entry again is fine

    class Impostor:
        name = "round"

    with pytest.raises(ValueError, match="widget 'round' is registered twice"):
        registry.register(Impostor)


def test_builtin_registries_are_found_without_a_module_list():
    assert {"digits", "mnist", "breast_cancer", "wine", "iris", "synthetic", "csv", "npz"} <= set(
        DATASETS.names()
    )
    kinds = MODELS.all()
    assert {"none", "linear", "mlp", "cnn", "cafe-conv", "cafe-fc"} <= set(kinds)
    assert {n for n, k in kinds.items() if k.image_input} >= {"cnn", "cafe-conv", "cafe-fc"}
    assert [n for n, k in kinds.items() if k.is_top and not k.is_bottom] == ["none"]
    assert "direct-label-inference" in ATTACKS and "dcae" in DEFENSES
    PROTOCOLS.all()  # scanning vflnet.protocols works (protocols register there)


def test_cli_lists_every_registry(capsys):
    for command, expected in (
        ("models", "cafe-conv"),
        ("datasets", "synthetic"),
        ("attacks", "norm-scoring"),
        ("defenses", "marvell"),
    ):
        assert cli.main([command]) == 0
        assert expected in capsys.readouterr().out


@pytest.fixture
def docs_plugin(tmp_path, monkeypatch):
    """The plug-in example of docs/config.md as a module, registering into copies of the registries."""
    text = (REPO / "docs/config.md").read_text()
    code = re.search(r"## Plug-ins.*?```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    (tmp_path / "docs_plugin_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    for registry in (DATASETS, MODELS):
        registry.names()
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    yield "docs_plugin_example"
    sys.modules.pop("docs_plugin_example", None)


def test_a_plugin_module_registers_a_dataset_and_a_model_kind(tmp_path, docs_plugin):
    data = base_config()
    data["plugins"] = [docs_plugin]
    data["data"] = {"dataset": "blobs", "params": {"n": 120}}
    for party, columns in zip(data["parties"][2:], ("0:3", "3:6"), strict=True):
        party["features"] = {"columns": columns}
        party["bottom"] = {"kind": "affine", "out": 4}
    cfg = load_config(write_config(tmp_path, data))  # checked against the dataset too
    from vflnet.data.partition import party_view
    from vflnet.models.zoo import build_bottom

    assert party_view(cfg, "passive-1").x.shape == (120, 3)  # type: ignore[union-attr]
    assert isinstance(build_bottom(cfg.party("passive-1").bottom, (3,)), nn.Linear)  # type: ignore[arg-type]
    data["data"]["params"] = {"n": 1}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "x.yaml")
    assert info.value.key == "data.params.n" and "expected an integer > 1" in info.value.message
    data["data"]["params"] = {}
    data["parties"][2]["bottom"]["kind"] = "affine-2"
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "x.yaml")
    assert info.value.key == "parties[2].bottom.kind" and "'affine'" in info.value.message


def test_new_keys_have_defaults_and_round_trip():
    cfg = config_from_dict(base_config())
    assert cfg.transport.bridge == "grpc" and cfg.protocol.params == {} and cfg.model_release == []
    p = cfg.predict
    assert (p.set, p.count, p.batch_size, p.when) == ("none", 0, 256, "end")
    data = base_config()
    data["transport"]["bridge"] = "loopback"
    data["predict"] = {"set": "test", "count": 50, "batch_size": 32, "when": "every_epoch"}
    data["model_release"] = [
        {"owner": "passive-1", "recipient": "active", "modules": ["bottom"], "when": "start"},
        {"owner": "active", "recipient": "coordinator", "modules": ["top"]},
    ]
    cfg = config_from_dict(data)
    assert cfg.transport.bridge == "loopback"
    assert (cfg.predict.set, cfg.predict.count, cfg.predict.batch_size, cfg.predict.when) == (
        "test",
        50,
        32,
        "every_epoch",
    )
    first, second = cfg.model_release
    assert (first.owner, first.recipient, first.modules, first.when) == (
        "passive-1",
        "active",
        ["bottom"],
        "start",
    )
    assert (second.owner, second.recipient, second.modules, second.when) == (
        "active",
        "coordinator",
        ["top"],
        "end",
    )
    assert config_from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    # protocol.params are the protocol's own settings: a protocol without any refuses them
    data["protocol"]["params"] = {"rounds": 3}
    with pytest.raises(ConfigError, match=r"protocol\.params.*'split' takes no parameter.*rounds"):
        config_from_dict(data)


@pytest.mark.parametrize(
    "change, key, text",
    [
        (lambda d: d.update(predict={"set": "all"}), "predict.set", "'test'"),
        (lambda d: d.update(predict={"count": -1}), "predict.count", "non-negative"),
        (lambda d: d.update(predict={"batch_size": 0}), "predict.batch_size", "positive"),
        (lambda d: d.update(predict={"when": "later"}), "predict.when", "'every_epoch'"),
        (lambda d: d["transport"].update(bridge="tcp"), "transport.bridge", "'loopback'"),
        (lambda d: d["protocol"].update(params=[1]), "protocol.params", "mapping"),
        (
            lambda d: d["protocol"].update(kind="gossip"),
            "protocol.kind",
            # other tests may have loaded a plug-in protocol into the registry
            "unknown protocol 'gossip'; known: hashvfl, param-server, ",
        ),
        (
            lambda d: d.update(model_release=[{"recipient": "active", "modules": ["bottom"]}]),
            "model_release[0].owner",
            "required",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "passive-1", "recipient": "eve", "modules": ["bottom"]}]
            ),
            "model_release[0].recipient",
            "no party 'eve'",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "active", "recipient": "active", "modules": ["top"]}]
            ),
            "model_release[0].recipient",
            "to itself",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "coordinator", "recipient": "active", "modules": ["top"]}]
            ),
            "model_release[0].owner",
            "only be a recipient",
        ),
        (
            lambda d: d.update(model_release=[{"owner": "passive-1", "recipient": "active", "modules": []}]),
            "model_release[0].modules",
            "at least one",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "passive-1", "recipient": "active", "modules": ["head"]}]
            ),
            "model_release[0].modules[0]",
            "'bottom', 'top'",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "passive-1", "recipient": "active", "modules": ["top"]}]
            ),
            "model_release[0].modules[0]",
            "only the active party has a top model",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "active", "recipient": "passive-1", "modules": ["bottom"]}]
            ),
            "model_release[0].modules[0]",
            "holds no features",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "active", "recipient": "passive-1", "modules": ["top", "top"]}]
            ),
            "model_release[0].modules[1]",
            "listed twice",
        ),
        (
            lambda d: d.update(
                model_release=[{"owner": "active", "recipient": "passive-1", "modules": ["top"], "when": "x"}]
            ),
            "model_release[0].when",
            "'start'",
        ),
    ],
)
def test_new_keys_errors_name_the_key(change, key, text):
    data = base_config()
    change(data)
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "run.yaml")
    assert info.value.key == key and text in info.value.message and "run.yaml" in str(info.value)


def test_no_top_model_means_the_active_party_has_no_top_to_release():
    data = base_config(aggregation="sum")
    data["model_release"] = [{"owner": "active", "recipient": "passive-1", "modules": ["top"]}]
    with pytest.raises(ConfigError, match="model.top.kind is 'none'"):
        config_from_dict(data)


def test_config_docs_are_generated_from_the_schema(capsys):
    assert cli.main(["config", "docs", "--check"]) == 0, capsys.readouterr()
