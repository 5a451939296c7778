"""`train.device` / `parties[].device`: where a party trains its models (CPU, or a GPU where torch has
one). Refused by name where it cannot act: a device torch cannot use on this machine, a protocol whose
parties train on the CPU only, a party whose defenses or attacks act inside its training, the
coordinator. On a GPU the run trains as on the CPU, with the same messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from vflnet.config import ConfigError
from vflnet.runner.loopback import run_loopback
from vflnet.validation import config_from_dict

REPO = Path(__file__).resolve().parents[1]
NO_CUDA = not torch.cuda.is_available()


def digits(**train: Any) -> dict[str, Any]:
    """configs/digits-2p.yaml as a loopback run of 2 epochs, with ``train`` settings on top."""
    data = yaml.safe_load((REPO / "configs" / "digits-2p.yaml").read_text())
    data["run"]["id"] = "device"
    data["transport"] = {"bridge": "loopback"}
    data["train"].update(epochs=2, **train)
    return data


def secureboost(**train: Any) -> dict[str, Any]:
    """configs/secureboost-digits.yaml with ``train`` settings on top."""
    data = yaml.safe_load((REPO / "configs" / "secureboost-digits.yaml").read_text())
    data["train"] = {**data.get("train", {}), **train}
    return data


def refusal(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "run.yaml")
    return info.value


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused_naming_the_key() -> None:
    error = refusal(digits(device="cuda"))
    assert error.key == "train.device" and "cannot use CUDA" in str(error) and "run.yaml" in str(error)
    data = digits()
    data["parties"][2]["device"] = "cuda:0"
    error = refusal(data)
    assert error.key == "parties[2].device" and "cannot use CUDA" in str(error)


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (lambda d: d["train"].update(device="gpu"), "train.device", "cpu, cuda or cuda:N"),
        (lambda d: d["parties"][0].update(device="cuda"), "parties[0].device", "coordinator trains no model"),
        (lambda d: d.update(secureboost(device="cuda")), "train.device", "trains on the CPU only"),
        (
            lambda d: (
                d["parties"][1].update(device="cuda"),
                d.update(defenses=[{"name": "mid", "party": "active"}]),
            ),
            "parties[1].device",
            "defense 'mid' acts inside its training",
        ),
    ],
)
def test_a_device_that_could_not_act_is_refused_by_name(change, key: str, words: str) -> None:
    """Each of these holds on any machine, with or without a GPU: the config check says why."""
    data = digits()
    change(data)
    error = refusal(data)
    assert error.key == key and words in str(error), str(error)


def test_cpu_is_the_default_and_names_no_device() -> None:
    cfg = config_from_dict(digits(), "run.yaml")
    assert [cfg.device(p) for p in cfg.parties] == ["cpu"] * 4
    data = digits()
    data["parties"][3]["device"] = "cpu"
    assert config_from_dict(data, "run.yaml").device(config_from_dict(data).parties[3]) == "cpu"


def _run(tmp_path: Path, name: str, data: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = copy.deepcopy(data)
    data["run"].update(dir=str(tmp_path), id=name)
    run_dir = tmp_path / name
    run_dir.mkdir()
    run_loopback(config_from_dict(data), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, [s for s in steps if s["kind"] == "step"]


@pytest.mark.skipif(NO_CUDA, reason="needs a GPU torch can use")
@pytest.mark.parametrize("protocol", ["split", "param-server"])
def test_a_gpu_run_trains_as_the_cpu_run_with_the_same_messages(tmp_path: Path, protocol: str) -> None:
    data = digits()
    data["protocol"]["kind"] = protocol
    cpu, cpu_steps = _run(tmp_path, "cpu", data)
    data["train"]["device"] = "cuda"
    gpu, gpu_steps = _run(tmp_path, "gpu", data)
    assert gpu["status"] == cpu["status"] == "completed"
    # the same message types and sizes on the wire, step by step
    assert [s["bytes_sent"] for s in gpu_steps] == [s["bytes_sent"] for s in cpu_steps]
    # float results may differ in the last bits (other kernels), not in what was learnt
    assert abs(gpu["final"]["test_accuracy"] - cpu["final"]["test_accuracy"]) <= 0.05


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
def test_only_the_parties_on_this_machine_need_their_device_here() -> None:
    """A lab machine starting one party (`vflnet party`) checks its own party's device, not the GPU
    another machine holds for another party; `config check` and `vflnet run` check every party."""
    from vflnet.config import parse
    from vflnet.validation import check

    data = digits()
    data["parties"][3]["device"] = "cuda"
    check(parse(copy.deepcopy(data), "run.yaml"), here=["active", "passive-1"])
    with pytest.raises(ConfigError, match="cannot use CUDA"):
        check(parse(copy.deepcopy(data), "run.yaml"), here=["passive-2"])
    with pytest.raises(ConfigError, match="parties\\[3\\].device"):
        check(parse(data, "run.yaml"))
