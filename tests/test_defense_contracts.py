"""Issue 36: every registered defense acts where its contract says. For each one, a one-step loopback
run with it and the same run without it, on a protocol that applies its hook point (`acts_on`); the
message that hook point names must differ:

- ``labels`` (active party): the gradients it answers ExchangeEmbeddings with (passive-1's trace);
- ``bottom`` (passive party): the embeddings passive-1 sends (its trace);
- ``upload`` (param-server): the gradient upload in passive-1's RunStep report (its trace);
- ``scores`` (active party): the confidence vectors the prediction phase releases (predictions/).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vflnet.interceptors.trace import read_trace, trace_path
from vflnet.registry import DEFENSES
from vflnet.runner.loopback import run_loopback
from vflnet.validation import config_from_dict
from vflnet.wire.tensors import from_proto, from_tensor_map

pytestmark = pytest.mark.e2e

BASE: dict[str, Any] = {
    "run": {"id": "contracts", "seed": 1},
    "data": {"dataset": "digits", "params": {"n": 120, "positive_class": 0}},  # binary: MARVELL too
    "parties": [
        {"name": "coordinator", "role": "coordinator"},
        {"name": "active", "role": "active"},
        {
            "name": "passive-1",
            "role": "passive",
            "features": {"region": [0, 8, 3, 4]},  # 8 pixels: masquerade needs d_A - 1 <= out
            "bottom": {"kind": "linear", "out": 8, "bias": False},  # masquerade's input-layer cut
        },
    ],
    "model": {"top": {"kind": "mlp", "hidden": [8]}},
    "train": {"epochs": 1, "max_steps": 1, "batch_size": 16},
    "predict": {"set": "test", "count": 16},
    "transport": {"bridge": "loopback"},
    "trace": {"parties": ["passive-1"]},
}
FAST = {"cae": {"ae_steps": 20}, "dcae": {"ae_steps": 20}, "fake-gradients": {"nu": 20, "max_rounds": 5}}


def _protocol(hook: str) -> str:
    return "param-server" if hook == "upload" else "split"


def _run(root: Path, protocol: str, defense: dict[str, Any] | None) -> Path:
    data = copy.deepcopy(BASE)
    data["protocol"] = {"kind": protocol}
    data["defenses"] = [defense] if defense else []
    run_dir = root / (defense["name"] if defense else f"none-{protocol}")
    run_loopback(config_from_dict(data, "contracts", check_data=True), run_dir)
    return run_dir


def _message(run_dir: Path, hook: str) -> list[np.ndarray]:
    """The arrays the hook point names, from the run's first message carrying them."""
    if hook == "scores":
        (path,) = (run_dir / "predictions").glob("predict-epoch-*.npz")
        return [np.load(path)["confidence"]]
    method, direction, side = {
        "labels": ("ExchangeEmbeddings", "response", "client"),
        "bottom": ("ExchangeEmbeddings", "request", "client"),
        "upload": ("RunStep", "response", "server"),
    }[hook]
    for event in read_trace(trace_path(run_dir, "passive-1")):
        if (event.short_method, event.direction, event.side) == (method, direction, side):
            if hook == "upload":
                grads = from_tensor_map(event.message.protocol.tensors, "upload")  # type: ignore[attr-defined]
                return [grads[k] for k in sorted(grads)]
            return [from_proto(event.message.values)]  # type: ignore[attr-defined]
    raise AssertionError(f"no {method} {direction} in passive-1's trace of {run_dir}")


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("baselines")
    return {p: _run(root, p, None) for p in ("split", "param-server")}


@pytest.mark.parametrize("name", DEFENSES.names())
def test_every_defense_changes_the_message_its_hook_point_names(name, baselines, tmp_path):
    cls = DEFENSES.get(name)
    hook = cls.acts_on
    party = "active" if hook in ("labels", "scores") else "passive-1"
    assert ("active" if party == "active" else "passive") in cls.roles
    protocol = _protocol(hook)
    defended = _run(tmp_path, protocol, {"name": name, "party": party, "params": FAST.get(name, {})})
    without, with_it = _message(baselines[protocol], hook), _message(defended, hook)
    assert [a.shape for a in without] == [b.shape for b in with_it]
    assert any(not np.array_equal(a, b) for a, b in zip(without, with_it, strict=True)), (
        f"{name} ({hook}) left the message unchanged"
    )


def test_a_plugin_defense_is_applied_where_its_hook_is(tmp_path: Path) -> None:
    """tests/plugins/top1_scores.py, loaded through `plugins:`, acts at the `scores` hook point: the
    released confidence vectors become one-hot vectors of the same top class."""
    plain = _message(_run(tmp_path, "split", None), "scores")[0]
    data = copy.deepcopy(BASE)
    data["plugins"] = ["tests.plugins.top1_scores"]
    data["protocol"] = {"kind": "split"}
    data["defenses"] = [{"name": "top1-scores", "party": "active"}]
    run_loopback(config_from_dict(data, "contracts", check_data=True), tmp_path / "top1")
    released = _message(tmp_path / "top1", "scores")[0]
    assert set(np.unique(released)) == {0.0, 1.0} and (released.sum(axis=1) == 1).all()
    assert (released.argmax(axis=1) == plain.argmax(axis=1)).all()
