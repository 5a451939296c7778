"""`vflnet sweep --emit k8s`: manifests valid against the Kubernetes API schemas and following
deploy/k8s's pod conventions; `vflnet sweep collect` over a folder laid out like the Jobs' results
volume gives the same table as the local sweep."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.test_k8s_manifests import KUBERNETES_VERSION
from tests.test_report import SCALE, sweep_dir, tiny_sweep_file  # noqa: F401 (sweep_dir: a fixture)
from vflnet.tools.experiments import sweep as sweep_cli
from vflnet.tools.experiments.plan import load_sweep
from vflnet.validation import config_from_dict


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("emit")
    sweep_file = tiny_sweep_file(tmp, {SCALE: [0.001, 2.0], "train.batch_size": [32, 64]}, [0, 1])
    out = tmp / "k8s"
    assert sweep_cli.main([str(sweep_file), "--emit", "k8s", "--out", str(out)]) == 0
    return sweep_file, list(yaml.safe_load_all((out / "jobs.yaml").read_text()))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_every_object_is_valid(emitted: tuple[Path, list[dict[str, Any]]]) -> None:
    _, docs = emitted
    assert len(of_kind(docs, "Job")) == len(of_kind(docs, "ConfigMap")) == 8
    assert len(of_kind(docs, "PersistentVolumeClaim")) == 1 and len(of_kind(docs, "Namespace")) == 1
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    names = [d["metadata"]["name"] for d in of_kind(docs, "Job")]
    assert len(set(names)) == 8 and all(len(n) <= 63 for n in names)


def test_a_misspelled_field_fails_validation(emitted: tuple[Path, list[dict[str, Any]]]) -> None:
    job = copy.deepcopy(of_kind(emitted[1], "Job")[0])
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


def test_each_job_runs_its_run_in_one_hardened_pod(emitted: tuple[Path, list[dict[str, Any]]]) -> None:
    sweep_file, docs = emitted
    runs = {r.name: r for r in load_sweep(sweep_file).runs}
    maps = {d["metadata"]["name"]: d for d in of_kind(docs, "ConfigMap")}
    claim = of_kind(docs, "PersistentVolumeClaim")[0]["metadata"]["name"]
    seen = set()
    for job in of_kind(docs, "Job"):
        pod = job["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"]
        (container,) = pod["containers"]
        assert container["image"] == "vflnet:0.1.0"
        hardening = container["securityContext"]
        assert hardening["readOnlyRootFilesystem"] and hardening["capabilities"] == {"drop": ["ALL"]}
        assert not hardening["allowPrivilegeEscalation"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        assert mounts["/tmp"] == {"name": "tmp", "emptyDir": {}}
        assert mounts["/results"]["persistentVolumeClaim"]["claimName"] == claim
        files = maps[mounts["/config"]["configMap"]["name"]]["data"]
        meta = json.loads(files["sweep-run.json"])
        run = runs[meta["run"]]
        assert meta["params"] == run.params and meta["seed"] == run.seed
        # the command a local sweep's workers run, into /results/<run>
        assert container["command"] == [
            "vflnet", "sweep", "one", "/config/run.yaml", "--meta", "/config/sweep-run.json",
            "--dest", f"/results/{run.name}",
        ]  # fmt: skip
        cfg = config_from_dict(yaml.safe_load(files["run.yaml"]), "run.yaml")
        assert cfg.transport.bridge == "loopback" and cfg.run.id == run.name and cfg.run.seed == run.seed
        assert cfg.train.batch_size == run.params["train.batch_size"]
        seen.add(run.name)
    assert seen == set(runs)


def test_collect_over_a_results_volume_gives_the_local_table(sweep_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    volume = tmp_path / "results"  # laid out as the Jobs write it: /results/<run>/
    volume.mkdir()
    for run in (sweep_dir / "runs").iterdir():
        shutil.copytree(run, volume / run.name)
    (volume / "lost+found").mkdir()  # what a fresh volume holds
    shutil.copytree(
        next((sweep_dir / "runs").iterdir()), volume / "r999-00000000.partial"
    )  # a pod killed mid-run
    assert sweep_cli.main(["collect", str(volume), "--out", str(tmp_path / "table")]) == 0
    local = sweep_dir / "results.csv"
    assert (tmp_path / "table" / "results.csv").read_text() == local.read_text()
    assert len(local.read_text().splitlines()) == 3  # header + 2 runs
    assert json.loads((tmp_path / "table" / "results.json").read_text()) == json.loads(
        (sweep_dir / "results.json").read_text()
    )
