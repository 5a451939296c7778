"""Every pod vflnet ships or emits passes the PodSecurity "restricted" profile, checked rule by rule
here (https://kubernetes.io/docs/concepts/security/pod-security-standards/); Jobs end and go away;
the parties' network is limited to their gRPC ports; compose containers are locked down the same way."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.test_deploy_static import compose_files
from vflnet.tools.experiments.k8s import manifests
from vflnet.tools.experiments.plan import load_sweep
from vflnet.validation import load_config

K8S = REPO / "deploy" / "k8s"
# the volume types "restricted" allows
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in pod spec ``pod`` breaks the "restricted" profile (its baseline rules included)."""
    problems = []
    pod_ctx = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds or not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']} is {sorted(kinds)}")
    containers = [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]
    for c in containers:
        ctx, name = c.get("securityContext", {}), c["name"]
        if ctx.get("privileged"):
            problems.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile type is {seccomp}, not RuntimeDefault or Localhost")
        capabilities = ctx.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        if any(port.get("hostPort") for port in c.get("ports", [])):
            problems.append(f"{name}: a hostPort")
    return problems


def k8s_docs() -> list[dict[str, Any]]:
    return [d for path in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def sweep_docs() -> list[dict[str, Any]]:
    return manifests(load_sweep(REPO / "configs" / "sweeps" / "dp-label-leak.yaml"))


@pytest.fixture(scope="module", params=["deploy/k8s", "sweep --emit k8s"])
def docs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return k8s_docs() if request.param == "deploy/k8s" else sweep_docs()


def jobs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [d for d in docs if d["kind"] == "Job"]
    assert found
    return found


def test_every_pod_passes_the_restricted_profile(docs: list[dict[str, Any]]) -> None:
    for job in jobs(docs):
        assert restricted_violations(job["spec"]["template"]["spec"]) == [], job["metadata"]["name"]


def test_the_namespace_enforces_the_restricted_profile(docs: list[dict[str, Any]]) -> None:
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_every_job_has_a_deadline_and_goes_away_after_it_ended(docs: list[dict[str, Any]]) -> None:
    for job in jobs(docs):
        assert job["spec"]["activeDeadlineSeconds"] > 0 and job["spec"]["ttlSecondsAfterFinished"] > 0


BREAKS = {
    "hostNetwork": lambda pod: pod.update(hostNetwork=True),
    "hostPath": lambda pod: pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
    "privileged": lambda pod: pod["containers"][0]["securityContext"].update(privileged=True),
    "escalation": lambda pod: pod["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
    "root": lambda pod: pod["securityContext"].pop("runAsNonRoot"),
    "uid 0": lambda pod: pod["containers"][0]["securityContext"].update(runAsUser=0),
    "seccomp": lambda pod: pod["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    "no seccomp": lambda pod: pod["securityContext"].pop("seccompProfile"),
    "drop": lambda pod: pod["containers"][0]["securityContext"].update(capabilities={"drop": ["NET_RAW"]}),
    "add": lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "hostPort": lambda pod: pod["containers"][0].update(ports=[{"containerPort": 1, "hostPort": 1}]),
}


@pytest.mark.parametrize("change", BREAKS)
def test_the_check_catches_each_rule(change: str) -> None:
    pod = copy.deepcopy(jobs(k8s_docs())[0]["spec"]["template"]["spec"])
    assert restricted_violations(pod) == []
    BREAKS[change](pod)
    assert restricted_violations(pod)


def test_a_localhost_profile_and_net_bind_service_are_allowed() -> None:
    pod = copy.deepcopy(jobs(k8s_docs())[0]["spec"]["template"]["spec"])
    pod["securityContext"]["seccompProfile"] = {"type": "Localhost", "localhostProfile": "vflnet.json"}
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    assert restricted_violations(pod) == []


def _ports(rule: dict[str, Any]) -> set[int]:
    return {p["port"] for p in rule["ports"] if p["protocol"] == "TCP"}


def test_the_parties_talk_only_on_their_grpc_ports() -> None:
    (policy,) = [d for d in k8s_docs() if d["kind"] == "NetworkPolicy"]
    roster = load_config(K8S / "config" / "run.yaml", check_data=False).parties
    grpc = {int(p.address.rsplit(":", 1)[1]) for p in roster}
    parties = {"matchExpressions": [{"key": "vflnet/party", "operator": "Exists"}]}
    spec = policy["spec"]
    assert spec["podSelector"] == parties and spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert ingress["from"] == [{"podSelector": parties}] and _ports(ingress) == grpc
    to_parties, dns = spec["egress"]
    assert to_parties["to"] == [{"podSelector": parties}] and _ports(to_parties) == grpc
    assert {p["port"] for p in dns["ports"]} == {53}
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in kustomization["resources"]
    for job in jobs(k8s_docs()):
        assert "vflnet/party" in job["spec"]["template"]["metadata"]["labels"]


def test_a_sweep_pod_is_cut_off_the_network() -> None:
    docs = sweep_docs()
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for job in jobs(docs):
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()


@pytest.mark.parametrize(
    "overlays",
    [(False,), (True,), (False, REPO / "deploy" / "compose.attacker.yml")],
    ids=["plaintext", "tls", "attacker"],
)
def test_every_compose_container_is_locked_down(overlays: tuple[Any, ...]) -> None:
    spec = compose_files(*overlays)
    for name, service in spec["services"].items():
        assert service["read_only"] is True and "/tmp" in service["tmpfs"], name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert float(service["cpus"]) > 0 and service["mem_limit"], name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a bind mount: a folder of the repository
                assert Path(REPO / source).is_dir(), f"{name} mounts {source}, which is not in the repository"
