"""Issue 36: a setting, attack or defense that would have no effect in the run is refused by
`vflnet config check` (a ConfigError naming the file, the key and what would be valid), never ignored."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, base_config, write_config
from vflnet.config import ConfigError
from vflnet.registry import ATTACKS, DEFENSES, PROTOCOLS
from vflnet.threat.attack import Tap
from vflnet.validation import load_config

SECUREBOOST = yaml.safe_load((REPO / "configs" / "secureboost-digits.yaml").read_text())


def _err(tmp_path, data: dict[str, Any]) -> ConfigError:
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    return info.value


def _split_with(**sections: Any) -> dict[str, Any]:
    data = base_config()
    data.update(sections)
    return data


# ------------------------------------------------------------------------- defense hook points
def test_a_defense_the_protocol_never_applies_is_refused_with_where_it_acts(tmp_path):
    data = _split_with(defenses=[{"name": "fake-gradients", "party": "passive-1"}])
    err = _err(tmp_path, data)
    assert err.key == "defenses[0].name"
    assert "'fake-gradients' acts on 'upload'" in err.message and "'split'" in err.message
    assert (
        "['bottom', 'labels', 'plaintext-embeddings', 'scores']" in err.message
        and "['param-server']" in err.message
    )


@pytest.mark.parametrize("defense, party", [("embedding-noise", "passive-1"), ("dp-gaussian", "active")])
def test_secureboost_refuses_bottom_and_label_defenses(tmp_path, defense, party):
    data = copy.deepcopy(SECUREBOOST)
    data["defenses"] = [{"name": defense, "party": party}]
    err = _err(tmp_path, data)
    assert err.key == "defenses[0].name" and "'secureboost'" in err.message and "['scores']" in err.message


def test_every_defense_hook_is_offered_by_some_protocol_and_accepted_there(tmp_path):
    hooks = {cls.acts_on for cls in DEFENSES.all().values()}
    offered = set().union(*(p.defense_hooks for p in PROTOCOLS.all().values()))
    assert hooks <= offered
    data = copy.deepcopy(base_config())
    data["protocol"]["kind"] = "param-server"
    data["defenses"] = [{"name": "dp-gradients", "party": "passive-1"}]
    load_config(write_config(tmp_path, data))  # the same defense where its hook exists: accepted


def test_round_scores_without_a_prediction_phase_is_refused(tmp_path):
    data = _split_with(defenses=[{"name": "round-scores", "party": "active"}])
    err = _err(tmp_path, data)
    assert err.key == "predict.set" and "round-scores" in err.message and "test or train" in err.message
    data["predict"] = {"set": "test"}
    load_config(write_config(tmp_path, data))


# ------------------------------------------------------------------------------------- taps
@pytest.mark.parametrize(
    "tap, what",
    [
        (Tap("ExchangeEmbeddings", "respnse", "server"), "direction 'respnse'"),
        (Tap("ExchangeEmbeddings", "request", "sever"), "side 'sever'"),
        (Tap("ExchangeEmbedding", "request", "server"), "method 'ExchangeEmbedding'"),
    ],
)
def test_an_attack_tap_that_can_never_match_is_refused(tmp_path, monkeypatch, tap, what):
    monkeypatch.setattr(ATTACKS.get("embedding-recorder"), "taps", (tap,))
    data = _split_with(attacks=[{"name": "embedding-recorder", "party": "active"}])
    err = _err(tmp_path, data)
    assert err.key == "attacks[0].name" and what in err.message and "'split'" in err.message
    assert "valid: [" in err.message


def test_an_attack_on_a_method_the_protocol_lacks_is_refused(tmp_path):
    err = _err(tmp_path, _split_with(attacks=[{"name": "decryption-oracle", "party": "passive-1"}]))
    assert err.key == "attacks[0].name" and "method 'Decrypt'" in err.message
    assert "'ExchangeEmbeddings'" in err.message and "'RunStep'" in err.message  # what is valid
    data = copy.deepcopy(SECUREBOOST)
    data["attacks"] = [{"name": "embedding-recorder", "party": "active"}]
    err = _err(tmp_path, data)
    assert "method 'ExchangeEmbeddings'" in err.message and "'Histograms'" in err.message


def test_every_vflnet_method_belongs_to_the_hosts_or_a_protocol():
    from vflnet.interceptors.events import METHODS
    from vflnet.sdk.contract import HOST_METHODS

    vflnet_methods = {m for m in METHODS if m.startswith("/vflnet.v1.")}
    declared = HOST_METHODS.union(*(p.methods for p in PROTOCOLS.all().values()))
    assert vflnet_methods <= declared


# --------------------------------------------------------------------------- feature overlap
@pytest.mark.parametrize(
    "features",
    [{"region": [0, 8, 3, 6]}, {"region": None, "columns": "3:5,40"}],
    ids=["region", "columns"],
)
def test_overlapping_features_are_refused_unless_allowed(tmp_path, features):
    data = base_config()  # passive-1: columns 0-3 of each row, passive-2: 4-7
    data["parties"][3]["features"] = features
    err = _err(tmp_path, data)
    assert err.key == "parties[3].features"
    assert "'passive-2' and 'passive-1'" in err.message and "data.allow_overlap: true" in err.message
    assert "column(s) [3, " in err.message  # the first shared column: pixel (0, 3)
    data["data"]["allow_overlap"] = True
    load_config(write_config(tmp_path, data))


# ------------------------------------------------------------------ protocol settings
@pytest.mark.parametrize(
    ("kind", "setting", "value", "takers"),
    [
        ("split", "static", True, "['param-server']"),
        ("split", "key_bits", 1024, "['secureboost', 'split-he']"),
        ("param-server", "workers", 2, "['secureboost', 'split-he']"),
        ("split-he", "static", True, "['param-server']"),
    ],
)
def test_a_protocol_setting_the_protocol_does_not_have_is_refused(tmp_path, kind, setting, value, takers):
    """Every protocol's settings are `protocol.params`, declared by its contract: one another protocol
    declares would have no effect here, so it is refused naming the protocols that have it."""
    data = _split_with()
    data["protocol"] = {"kind": kind, "params": {setting: value}}
    if kind == "split-he":
        data["protocol"]["aggregation"] = "sum"
    err = _err(tmp_path, data)
    assert err.key == f"protocol.params.{setting}"
    assert f"protocol {kind!r} takes no parameter(s) [{setting!r}]" in err.message and takers in err.message


@pytest.mark.parametrize("old", ["static", "he"])
def test_a_protocol_setting_outside_params_is_refused_with_where_it_goes(tmp_path, old):
    data = _split_with()
    data["protocol"] = {"kind": "param-server", old: True}
    err = _err(tmp_path, data)
    assert err.key == f"protocol.{old}" and "unknown key" in err.message
    assert "protocol's own settings go under protocol.params" in err.message


def test_the_paillier_settings_are_checked_by_the_protocol(tmp_path):
    data = base_config(aggregation="sum")
    data["protocol"] = {"kind": "split-he", "aggregation": "sum", "params": {"workers": 0}}
    err = _err(tmp_path, data)
    assert err.key == "protocol.params.workers" and "'workers': expected an integer >= 1" in err.message
    data["protocol"]["params"] = {"key_bits": 512}
    err = _err(tmp_path, data)
    assert err.key == "protocol.params.key_bits" and "allow_insecure_keys: true" in err.message


# ------------------------------------------------------------------ knowledge a protocol provides
def test_an_attack_needing_knowledge_its_protocol_does_not_provide_is_refused(tmp_path):
    """CAFE's server learns the architecture from the parameters it holds: only param-server's contract
    provides it (`Protocol.provides`), so under split the attack is refused, naming who provides it."""
    data = _split_with(attacks=[{"name": "cafe", "party": "coordinator"}])
    err = _err(tmp_path, data)
    assert err.key == "attacks[0].name"
    assert "needs 'architecture'" in err.message
    assert "protocol 'split' does not provide it (protocols that do: ['param-server'])" in err.message
    assert {n: p.provides for n, p in PROTOCOLS.all().items() if p.provides} == {
        "param-server": frozenset({"architecture"}),
        "split-he": frozenset({"public_key"}),
    }
