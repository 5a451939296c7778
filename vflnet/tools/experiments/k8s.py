"""`vflnet sweep SWEEP.yaml --emit k8s --out DIR`: one Kubernetes Job per run of a sweep.

Each Job is one pod that runs its whole run over the loopback bridge (`vflnet sweep one`, the
command a local sweep's workers run). Why one pod and not one pod per party as deploy/k8s does: a
sweep is many independent runs, and a run's parties in one process need no Services, certificates,
start order or per-party volumes, and its results are bit-identical to the same run over gRPC. The
scheduler spreads the runs over the cluster instead. deploy/k8s remains the way to run one run as
separate pods over the network.

DIR/jobs.yaml holds the Namespace (PodSecurity "restricted" enforced), one results
PersistentVolumeClaim that every run writes ``/results/<run>/`` to, a NetworkPolicy that cuts the
sweep's pods off the network (a run in one process talks to no one), and per run a ConfigMap (its
run.yaml and sweep-run.json) and a Job. Pods follow deploy/k8s's conventions: image vflnet:0.1.0,
non-root UID 10001, RuntimeDefault seccomp, read-only root file system, no privilege escalation,
every capability dropped, /tmp an emptyDir; a Job is stopped after ACTIVE_DEADLINE_S and removed
TTL_AFTER_FINISHED_S after it ended. A Job retried after a failed or evicted pod
resumes like a local sweep: `vflnet sweep one` renames a run directory into place only once complete.
Copy the volume's contents out and `vflnet sweep collect` them into the same table as a local sweep.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from vflnet.tools.experiments.plan import PlannedRun, Sweep, plan_json, run_meta
from vflnet.tools.experiments.results import write_atomic

IMAGE = "vflnet:0.1.0"
NAMESPACE = "vflnet"
UID = 10001
RESULTS = "/results"
CONFIG = "/config"
ACTIVE_DEADLINE_S = 43200  # 12 h for a run, its retries included
TTL_AFTER_FINISHED_S = 86400  # the finished Job and its pod go a day later; the results volume stays


def dns_label(text: str, max_len: int) -> str:
    """``text`` as a DNS-1123 label prefix (lowercase alphanumerics and '-'), at most ``max_len`` long."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:max_len]
    return label.strip("-") or "sweep"


def object_name(sweep: Sweep, run: PlannedRun) -> str:
    """``sweep-<sweep name>-<run name>``, within Kubernetes' 63 characters (a Job's pods add none)."""
    return f"{dns_label('sweep-' + sweep.name, 63 - 1 - len(run.name))}-{run.name}"


def labels(sweep: Sweep, run: PlannedRun | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "vflnet",
        "app.kubernetes.io/version": "0.1.0",
        "vflnet/sweep": dns_label(sweep.name, 63),
    }
    if run is not None:
        out["vflnet/run"] = run.name
    return out


def results_claim(sweep: Sweep) -> str:
    return f"{dns_label('sweep-' + sweep.name, 55)}-results"


def run_config(run: PlannedRun) -> dict[str, Any]:
    """The run's config for its pod: every role in the pod's one process."""
    config = json.loads(json.dumps(run.config))  # a deep copy
    config.setdefault("transport", {})["bridge"] = "loopback"
    config["run"]["dir"] = RESULTS  # unused (`sweep one` names the run directory), but not a local path
    return config


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a ConfigMap's files) as literal blocks, readable in jobs.yaml."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def manifests(sweep: Sweep) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": results_claim(sweep), "namespace": NAMESPACE, "labels": labels(sweep)},
            # ReadWriteOnce: every pod of the sweep on the node that mounts it (kind, minikube, one
            # node); on several nodes use a ReadWriteMany storage class (docs/experiments.md)
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": dns_label("sweep-" + sweep.name, 63), "namespace": NAMESPACE},
            # no rule: nothing in or out (every party of a run is in its pod's one process)
            "spec": {
                "podSelector": {"matchLabels": {"vflnet/sweep": labels(sweep)["vflnet/sweep"]}},
                "policyTypes": ["Ingress", "Egress"],
            },
        },
    ]
    for run in sweep.runs:
        name = object_name(sweep, run)
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels(sweep, run)},
                "data": {
                    "run.yaml": yaml.safe_dump(run_config(run), sort_keys=False),
                    "sweep-run.json": json.dumps(run_meta(sweep, run), indent=2),
                },
            }
        )
        docs.append(job(sweep, run, name))
    return docs


def job(sweep: Sweep, run: PlannedRun, name: str) -> dict[str, Any]:
    command = ["vflnet", "sweep", "one", f"{CONFIG}/run.yaml", "--meta", f"{CONFIG}/sweep-run.json"]
    container = {
        "name": "run",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": [*command, "--dest", f"{RESULTS}/{run.name}"],
        "env": [{"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG, "readOnly": True},
            {"name": "results", "mountPath": RESULTS},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels(sweep, run)},
        "spec": {
            "backoffLimit": 2,  # a retried pod resumes: finished runs are kept, a partial one redone
            "activeDeadlineSeconds": ACTIVE_DEADLINE_S,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {"labels": labels(sweep, run)},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "runAsGroup": UID,
                        "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": name}},
                        {"name": "results", "persistentVolumeClaim": {"claimName": results_claim(sweep)}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def emit(sweep: Sweep, out: Path) -> Path:
    """Write DIR/jobs.yaml (and DIR/sweep.json, the plan); return the manifests' path."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sweep.json", json.dumps(plan_json(sweep), indent=2))
    path = out / "jobs.yaml"
    write_atomic(path, yaml.dump_all(manifests(sweep), Dumper=_Dumper, sort_keys=False))
    return path
