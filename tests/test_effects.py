"""The host counts what every attack, defense and protocol hook point did (vflnet/threat/effects.py):
one tiny run per registered attack and defense shows non-zero counts in summary.json; an entry that
acted zero times fails the run by name (a protocol plug-in that declares a hook and never applies it,
a backdoor that poisoned no step); offline attacks refuse a trace they cannot act on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config, write_config
from vflnet.interceptors.trace import TraceWriter, read_trace
from vflnet.registry import ATTACKS, DEFENSES
from vflnet.runner.local import run_local

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "vflnet/examples"
HE = {"key_bits": 512, "allow_insecure_keys": True}


def _example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _tiny(data: dict[str, Any], steps: int = 3) -> dict[str, Any]:
    data["train"].update(epochs=1, max_steps=steps)
    data["transport"] = {**(data.get("transport") or {}), "bridge": "loopback"}
    data.setdefault("run", {})["id"] = "effects"
    data["trace"] = {"parties": []}
    return data


def _digits(attacks: list[dict[str, Any]] = (), defenses: list[dict[str, Any]] = (), **over: Any) -> dict:
    data = base_config(n_passive=2, aggregation="sum")
    data.update(attacks=list(attacks), defenses=list(defenses), **over)
    return _tiny(data)


def _binary(attacks: list[dict[str, Any]] = (), defenses: list[dict[str, Any]] = ()) -> dict:
    data = _example("scoring-cancer.yaml")
    data.update(attacks=list(attacks), defenses=list(defenses))
    data["run"].pop("dir", None)
    return _tiny(data)


def _hash(attacks: list[dict[str, Any]]) -> dict:
    data = base_config(n_passive=2)
    data["protocol"] = {"kind": "hashvfl", "aggregation": "concat", "params": {"variant": "hashvfl"}}
    for p in data["parties"][2:]:
        p["bottom"]["out"] = 4
    data["model_release"] = [
        {"owner": "passive-1", "recipient": "active", "modules": ["bottom"]},
        {"owner": "active", "recipient": "passive-2", "modules": ["top"]},
    ]
    data["predict"] = {"set": "test", "count": 16}
    data["attacks"] = attacks
    return _tiny(data)


def _predictions(attacks: list[dict[str, Any]], protocol: dict[str, Any] | None = None, **over: Any) -> dict:
    data = _example("esa-synthetic.yaml")
    data["attacks"] = attacks
    data["predict"]["count"] = 100
    if protocol is not None:
        data["protocol"] = protocol
        for p in data["parties"][1:]:
            p["bottom"] = {"kind": "splits", "out": 10}
        data["train"]["batch_size"] = 100000
        for unread in ("optimizer", "lr_schedule"):  # trees: config check refuses them
            data["train"].pop(unread, None)
    data.update(over)
    return _tiny(data, steps=1 if protocol else 3)


def _backdoor(**params: Any) -> dict:
    data = _example("backdoor-digits.yaml")
    data["attacks"][0]["params"].update(n_target=100, poison_fraction=0.3, **params)
    data["train"]["batch_size"] = 16
    return _tiny(data)


def _param_server(defense: str) -> dict:
    data = base_config(n_passive=2)
    data["protocol"] = {"kind": "param-server", "aggregation": "concat"}
    data["defenses"] = [
        {"name": defense, "party": "passive-1", "params": {"nu": 10} if "fake" in defense else {}}
    ]
    return _tiny(data)


def _attack(name: str, party: str = "passive-1", **params: Any) -> dict[str, Any]:
    return {"name": name, "party": party, "params": params}


ATTACK_RUNS = {
    "direct-label-inference": lambda: _digits([_attack("direct-label-inference")]),
    "embedding-recorder": lambda: _digits([_attack("embedding-recorder", "active")]),
    "gradient-scaling": lambda: _digits([_attack("gradient-scaling", gamma=2.0)]),
    "analytic-label-recovery": lambda: _digits([_attack("analytic-label-recovery")]),
    "gradient-inversion-label-inference": lambda: _digits(
        [_attack("gradient-inversion-label-inference", iterations=20)]
    ),
    "passive-model-completion": lambda: _digits(
        [_attack("passive-model-completion", fine_tune_bottom=False, epochs=5)]
    ),
    "norm-scoring": lambda: _binary([_attack("norm-scoring")]),
    "direction-scoring": lambda: _binary([_attack("direction-scoring")]),
    "decryption-oracle": lambda: _digits(
        [_attack("decryption-oracle")], protocol={"kind": "split-he", "aggregation": "sum", "params": HE}
    ),
    "backdoor": lambda: _backdoor(),
    "cafe": lambda: _tiny(
        {
            **_example("cafe-digits.yaml"),
            "attacks": [_attack("cafe", "coordinator", nested_iterations=[5, 5])],
        }
    ),
    "feature-reconstruction": lambda: _tiny(_example("feature-reconstruction.yaml")),
    "esa": lambda: _predictions([_attack("esa", "active")]),
    "grna": lambda: _predictions([_attack("grna", "active", epochs=2)]),
    "pra": lambda: _predictions(
        [_attack("pra", "active")], {"kind": "secureboost", "aggregation": "sum", "params": {"mode": "plain"}}
    ),
    "model-inversion": lambda: _hash(
        [_attack("model-inversion", "active", iterations=5, n_samples=2, image_shape=[8, 4])]
    ),
    "pgd-code-rewrite": lambda: _hash([_attack("pgd-code-rewrite", "passive-2", omega=2, eta=1)]),
    "hamming-detector": lambda: _hash([_attack("hamming-detector", "active")]),
}

LABEL_DEFENSE_PARAMS = {"cae": {"ae_steps": 5}, "dcae": {"ae_steps": 5}}


def _defense_run(name: str) -> dict[str, Any]:
    cls = DEFENSES.get(name)
    if cls.acts_on == "upload":
        return _param_server(name)
    if cls.acts_on == "scores":
        return _predictions([], defenses=[{"name": name, "party": "active"}])
    if cls.acts_on == "bottom":
        data = _tiny(_example("feature-reconstruction.yaml"))  # an input-layer cut (masquerade's)
        data.update(attacks=[], defenses=[{"name": name, "party": "passive-1"}])
        return data
    entry = {"name": name, "party": "active", "params": LABEL_DEFENSE_PARAMS.get(name, {})}
    return _binary(defenses=[entry]) if name == "marvell" else _digits(defenses=[entry])


def _builtin(registry: Any) -> list[str]:
    """The registered names vflnet itself holds (a test's plug-ins may have registered more)."""
    return sorted(n for n, c in registry.all().items() if c.__module__.startswith("vflnet."))


def _run(tmp_path: Path, data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    rc = run_local(write_config(tmp_path, data), run_dir=tmp_path / "run", progress=False)
    return rc, json.loads((tmp_path / "run/summary.json").read_text())


def test_every_registered_attack_and_defense_has_a_run_here():
    assert sorted(ATTACK_RUNS) == _builtin(ATTACKS)
    for name in _builtin(DEFENSES):
        _defense_run(name)  # every hook point has its run


@pytest.mark.e2e
@pytest.mark.parametrize("name", _builtin(ATTACKS))
def test_every_attack_shows_what_it_did_in_summary_json(tmp_path, capsys, name):
    rc, summary = _run(tmp_path, ATTACK_RUNS[name]())
    assert rc == 0 and summary["status"] == "completed", summary.get("error")
    counts = summary["effects"]["attacks"]
    (key,) = [k for k in counts if k.startswith(f"{name}@")]
    acted = {k: v for k, v in counts[key].items() if v}
    assert acted, counts
    assert summary["effects"]["never_acted"] == {}  # all it declares, it did
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"acted {key} ")]
    assert len(table) == 1 and all(f" {v}" in table[0] for v in acted.values()), table


@pytest.mark.e2e
@pytest.mark.parametrize("name", _builtin(DEFENSES))
def test_every_defense_and_its_hook_show_what_they_did_in_summary_json(tmp_path, name):
    rc, summary = _run(tmp_path, _defense_run(name))
    assert rc == 0 and summary["status"] == "completed", summary.get("error")
    effects = summary["effects"]
    (key,) = [k for k in effects["defenses"] if k.startswith(f"{name}@")]
    d = effects["defenses"][key]
    assert d["acted"] > 0 and d["hook"] == DEFENSES.get(name).acts_on
    hook = effects["hooks"][f"{d['hook']}@{key.split('@')[1]}"]
    assert hook["applied"] >= d["acted"] and hook["defenses"] == 1


@pytest.mark.e2e
def test_a_protocol_that_declares_a_hook_and_never_applies_it_fails_the_run(tmp_path):
    data = _digits(defenses=[{"name": "dp-gaussian", "party": "active"}])
    data["plugins"] = ["tests.plugins.forgetful_protocol"]
    data["protocol"]["kind"] = "forgetful-split"
    rc, summary = _run(tmp_path, data)
    assert rc != 0 and summary["status"] == "failed"
    assert (
        "defense dp-gaussian@active acted 0 times: protocol 'forgetful-split' declares hook 'labels' but "
        "never applied it" in summary["error"]
    )
    assert summary["effects"]["defenses"]["dp-gaussian@active"]["acted"] == 0


@pytest.mark.e2e
def test_a_backdoor_that_poisoned_no_step_fails_the_run_by_name(tmp_path, capsys):
    data = _backdoor()
    data["attacks"][0]["params"].update(poison_fraction=0.0)  # one sample of D_backdoor
    data["train"].update(max_steps=1, batch_size=4)
    rc, summary = _run(tmp_path, data)
    assert rc != 0 and summary["status"] == "failed"
    assert "backdoor@passive-1 poisoned 0 steps" in summary["error"], summary["error"]
    assert "backdoor@passive-1 poisoned 0 steps" in capsys.readouterr().err  # the launcher's exit line
    assert summary["effects"]["attacks"]["backdoor@passive-1"]["tapped"] == 1  # it saw the JoinReply
    assert summary["effects"]["never_acted"].keys() == {"backdoor@passive-1"}


# ------------------------------------------------------------------------------- offline
def _vflnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vflnet", *args], capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.e2e
def test_offline_attacks_refuse_a_trace_they_cannot_act_on(tmp_path):
    data = _digits([_attack("direct-label-inference")])
    data["trace"] = {"parties": ["active", "passive-1"]}
    rc, _ = _run(tmp_path, data)
    assert rc == 0
    traces = tmp_path / "run/traces"
    out = tmp_path / "out.npz"
    admission = tmp_path / "admission.trace"  # passive-1's trace up to its first step: no gradient in it
    writer = TraceWriter(admission, "passive-1", "effects")
    for event in read_trace(traces / "passive-1.trace"):
        if event.short_method == "Join":
            writer.write_record(*event.as_record())
    writer.close()
    cases = {  # the active party's trace at a passive attack's position
        "is the trace of active": [
            "direct-label-inference",
            "--trace",
            traces / "active.trace",
            "--role",
            "passive",
        ],
        "no message of": ["direct-label-inference", "--trace", admission, "--role", "passive"],
        "taps no message": ["gradient-scaling", "--trace", traces / "passive-1.trace", "--role", "passive"],
        "cannot read": ["direct-label-inference", "--trace", tmp_path / "missing.trace", "--role", "passive"],
        "sits at": ["direct-label-inference", "--trace", traces / "passive-1.trace", "--role", "active"],
    }
    for said, args in cases.items():
        got = _vflnet("attack", *map(str, args), "--out", str(out))
        assert got.returncode == 2, (said, got.stdout, got.stderr)
        text = (got.stdout + got.stderr).strip()
        assert said in text and "Traceback" not in text and len(text.splitlines()) == 1, text
        assert not out.exists()
    got = _vflnet(
        "attack", "direct-label-inference", "--trace", str(traces / "passive-1.trace"), "--role", "passive"
    )
    assert got.returncode == 0, got.stderr
    assert "sample_ids: shape (192,)" in got.stdout


# --------------------------------------------------------------------------------- audit
@pytest.mark.e2e
def test_an_audit_row_whose_attack_never_acted_reads_failed_never_acted(tmp_path):
    """One training step of four samples: the backdoor's D_backdoor is in no batch, so it poisons
    nothing; its row says so instead of a score, and the run's other rows are scored."""
    from vflnet.tools.audit import cli

    out = tmp_path / "audit"
    overrides = [
        "protocol.aggregation=sum",
        "model.top={kind: none}",
        "parties[2].bottom.out=10",
        "parties[3].bottom.out=10",
        "transport.bridge=loopback",
        "train.max_steps=1",
        "train.batch_size=4",
    ]
    assert (
        cli.main(
            [str(ROOT / "configs/digits-2p.yaml"), "--quick", "--seeds", "1", "--out", str(out), *overrides]
        )
        == 0
    )
    result = json.loads((out / "audit.json").read_text())
    rows = {(r["attack"], r["position"]): r["by_setting"]["none"] for r in result["applicable"]}
    backdoor = rows[("backdoor", "passive party passive-2")]
    assert backdoor["verdict"].startswith("failed: never acted (backdoor@passive-2 poisoned 0 steps"), (
        backdoor
    )
    assert "mean" not in backdoor and "metric" not in backdoor
    direct = rows[("direct-label-inference", "passive party passive-1")]
    assert direct["metric"] == "label_accuracy" and not direct["verdict"].startswith("failed"), direct
    assert "failed: never acted" in (out / "audit.md").read_text()
