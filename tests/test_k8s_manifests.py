"""deploy/k8s as a cluster would receive it: rendered by kustomize (with certificates made the way
docs/deploy.md says), then every object validated strictly against the Kubernetes API schemas
(kubernetes-validate, offline). No cluster runs here; this is what keeps the manifests apply-ready.
What the containers run is checked in tests/test_deploy_static.py."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO
from vflnet.wire import certs_cli

# The oldest Kubernetes release the manifests promise to apply on (docs/deploy.md).
KUBERNETES_VERSION = "1.29"
PARTIES = {"coordinator": "coordinator", "active": "active", "passive-1": "passive", "passive-2": "passive"}


def kustomize() -> str:
    found = shutil.which("kustomize", path=str(Path(sys.executable).parent)) or shutil.which("kustomize")
    if found is None:
        pytest.fail(
            "kustomize is not installed: `bash scripts/install-kustomize.sh .venv/bin` (make setup does)"
        )
    return found


def render(k8s_dir: Path, work: Path) -> list[dict[str, Any]]:
    """``kustomize build`` of a copy of ``k8s_dir`` with freshly made certificates."""
    copy_dir = work / "k8s"
    shutil.copytree(k8s_dir, copy_dir)
    parties = [f"{name}:{role}:{name}.vflnet.svc" for name, role in PARTIES.items()]
    assert (
        certs_cli.main(["--out", str(copy_dir / "certs"), *[a for p in parties for a in ("--party", p)]]) == 0
    )
    result = subprocess.run([kustomize(), "build", str(copy_dir)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(REPO / "deploy" / "k8s", tmp_path_factory.mktemp("render"))


def test_every_rendered_object_is_valid(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds.count("Job") == 4 and kinds.count("Service") == 4 and kinds.count("Secret") == 4
    assert {"Namespace", "ConfigMap", "PersistentVolumeClaim"} <= set(kinds)
    for doc in rendered:
        validate(doc)
        assert doc["metadata"].get("namespace", "vflnet") == "vflnet"


def test_generated_names_are_followed(rendered: list[dict[str, Any]]) -> None:
    """kustomize suffixes generated ConfigMaps/Secrets with a hash; every reference must use it."""
    generated = {doc["metadata"]["name"] for doc in rendered if doc["kind"] in ("ConfigMap", "Secret")}
    for job in (doc for doc in rendered if doc["kind"] == "Job"):
        for volume in job["spec"]["template"]["spec"]["volumes"]:
            name = volume.get("configMap", {}).get("name") or volume.get("secret", {}).get("secretName")
            if name:
                assert name in generated, f"{job['metadata']['name']} mounts {name}, which is not generated"


def misspelled(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with one field of its pod spec misspelled (restartPolicy -> restartPolicyy)."""
    doc = copy.deepcopy(doc)
    pod = doc["spec"]["template"]["spec"]
    pod["restartPolicyy"] = pod.pop("restartPolicy")
    return doc


def test_a_misspelled_field_fails_validation(rendered: list[dict[str, Any]]) -> None:
    job = next(doc for doc in rendered if doc["kind"] == "Job")
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        validate(misspelled(job))


def test_a_misspelled_field_in_the_manifests_fails(tmp_path: Path) -> None:
    """The same through the source files: a typo in deploy/k8s/parties.yaml is caught after rendering."""
    broken = tmp_path / "broken"
    shutil.copytree(REPO / "deploy" / "k8s", broken)
    parties = broken / "parties.yaml"
    text = parties.read_text()
    assert "readinessProbe:" in text
    parties.write_text(text.replace("readinessProbe:", "readinessprobe:", 1))
    docs = render(broken, tmp_path / "work")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessprobe"):
        for doc in docs:
            validate(doc)
