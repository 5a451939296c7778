"""Deployment files agree with the CLI and with the run configs they mount (no Docker or cluster needed).

Every command is parsed by the real ``vflnet`` argument parser; subcommands it does not have yet
(``certs``, ``health``, ``proxy``) fall back to the contract below, so a typo in an option name or a
party started under the wrong role fails here rather than in a container.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from vflnet import cli, validation
from vflnet.config import Config

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
TLS_OVERLAY = REPO / "deploy" / "compose.tls.yml"
FILES_OVERLAY = REPO / "deploy" / "compose.files.yml"
ATTACKER_OVERLAY = REPO / "deploy" / "compose.attacker.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
K8S = REPO / "deploy" / "k8s"
LAB = REPO / "deploy" / "lab"
DEFAULT_CONFIG = REPO / "configs" / "digits-2p.yaml"
PARTIES = ("coordinator", "active", "passive-1", "passive-2")


# ------------------------------------------------------------------------------------------ parsing
def contract_parser() -> argparse.ArgumentParser:
    """The agreed CLI for subcommands the real parser does not have yet."""
    parser = argparse.ArgumentParser(prog="vflnet", exit_on_error=False)
    sub = parser.add_subparsers(dest="command", required=True)
    proxy = sub.add_parser("proxy")
    proxy.add_argument("--listen", required=True)
    proxy.add_argument("--upstream", required=True)
    return parser


def parse_vflnet(argv: list[str]) -> argparse.Namespace:
    """Parse ``vflnet ...`` with the real parser where it knows the subcommand, else the contract."""
    assert argv[:1] == ["vflnet"], f"not a vflnet command: {shlex.join(argv)}"
    command = argv[1] if len(argv) > 1 else ""
    if command in cli.COMMANDS:  # main() hands the rest to the command's module
        parser, rest = cli.COMMANDS[command].load().build_parser(), argv[2:]
    else:
        parser, rest = contract_parser(), argv[1:]
    try:
        args = parser.parse_args(rest)
    except (SystemExit, argparse.ArgumentError) as exc:
        raise AssertionError(f"invalid vflnet invocation: {shlex.join(argv)} ({exc})") from exc
    args.command = command
    return args


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def load_config(path: Path) -> Config:
    return validation.load_config(path, check_data=False)


def job(cfg: Config) -> dict[str, Any]:
    """The training job of a config: everything but where it runs (addresses, run id/dir, transport)."""
    plain = cfg.to_dict()
    for party in plain["parties"]:
        party.pop("address")
    plain.pop("transport")
    plain["run"].pop("id")
    plain["run"].pop("dir")
    return plain


# ------------------------------------------------------------------------------------------ compose
def merge_service(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """docker compose's merge for the keys used here: mappings merge, volumes merge by target, rest replace."""
    merged = dict(base)
    for key, value in overlay.items():
        if key in ("healthcheck", "depends_on") and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        elif key == "volumes" and key in base:
            by_target = {v.split(":")[1]: v for v in base[key]}
            by_target.update({v.split(":")[1]: v for v in value})
            merged[key] = list(by_target.values())
        else:
            merged[key] = value
    return merged


def compose_files(with_tls: bool, *more: Path) -> dict[str, Any]:
    """docker-compose.yml, plus the TLS overlay if ``with_tls``, plus ``more`` overlays, merged."""
    spec = yaml.safe_load(COMPOSE.read_text())
    for path in [TLS_OVERLAY] * with_tls + list(more):
        overlay = yaml.safe_load(path.read_text())
        services = dict(spec["services"])
        for name, service in overlay["services"].items():
            services[name] = merge_service(services.get(name, {}), service)
        spec = {
            "services": services,
            "volumes": {**spec.get("volumes", {}), **(overlay.get("volumes") or {})},
        }
    return spec


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (``./configs`` or a named volume)."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Where a container path of a bind-mounted file lives in the repository."""
    path = PurePosixPath(container_path)
    for target, source in mounts(service).items():
        if source.startswith("./") and path.is_relative_to(target):
            return REPO / source / path.relative_to(target)
    raise AssertionError(f"{container_path} is not on a bind mount ({mounts(service)})")


def on_mount(service: dict[str, Any], container_path: str) -> bool:
    return any(PurePosixPath(container_path).is_relative_to(target) for target in mounts(service))


@pytest.fixture(params=[False, True], ids=["plaintext", "tls-overlay"])
def compose(request: pytest.FixtureRequest) -> tuple[dict[str, Any], bool]:
    return compose_files(request.param), request.param


def test_compose_has_the_cluster(compose) -> None:
    spec, with_tls = compose
    services = spec["services"]
    assert set(PARTIES) <= set(services)
    assert "runs" in spec["volumes"]
    for name in PARTIES:
        assert mounts(services[name])["/configs"] == "./configs"
        assert "/configs:ro" in " ".join(services[name]["volumes"])
        assert mounts(services[name])["/runs"] == "runs"
    if with_tls:  # each party mounts its own certificate volume, and none mounts the CA's
        assert all(mounts(services[name])["/certs"] == f"certs-{name}" for name in PARTIES)
        assert all(f"certs-{name}" in spec["volumes"] for name in PARTIES)
        assert not any("ca" in mounts(services[name]).values() for name in PARTIES)


def test_compose_party_commands_match_the_mounted_roster(compose) -> None:
    spec, with_tls = compose
    services = spec["services"]
    for name in PARTIES:
        service = services[name]
        args = parse_vflnet(service["command"])
        assert args.command == "party"
        cfg = load_config(host_path(service, str(args.config)))
        assert cfg.transport.tls.enabled == with_tls
        me = cfg.party(args.name)
        assert args.name == name, "compose service names are the party names (DNS = roster host)"
        assert args.role == me.role
        assert me.address == f"{name}:{port(me.address)}"
        assert args.listen is None or port(args.listen) == port(me.address)
        assert service["expose"] == [str(port(me.address))]
        if me.role != "coordinator":
            assert args.coordinator == cfg.coordinator.address
            assert service["depends_on"]["coordinator"] == {"condition": "service_healthy"}
        assert on_mount(service, args.run_dir or cfg.run.dir), "the run directory must be on the runs volume"
        if with_tls:
            tls = cfg.transport.tls
            for path in (tls.ca, tls.cert.format(name=name), tls.key.format(name=name)):
                assert mounts(service)[str(PurePosixPath(path).parent)] == f"certs-{name}"
            # `up --exit-code-from coordinator` would stop the cluster when a one-shot dependency exits
            assert "certs" not in service.get("depends_on", {})


def test_compose_healthchecks_ask_each_party_on_its_port(compose) -> None:
    spec, with_tls = compose
    for name in PARTIES:
        service = spec["services"][name]
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD"
        args = parse_vflnet(test[1:])
        assert args.command == "health"
        cfg = load_config(host_path(service, str(parse_vflnet(service["command"]).config)))
        assert args.address == cfg.party(name).address
        if with_tls:
            tls = cfg.transport.tls
            assert (args.ca, args.cert, args.key) == (
                tls.ca,
                tls.cert.format(name=name),
                tls.key.format(name=name),
            )
        else:
            assert args.ca is None


def test_compose_proxy_and_certs_commands() -> None:
    services = compose_files(True, ATTACKER_OVERLAY)["services"]
    proxy = parse_vflnet(services["proxy"]["command"])
    assert proxy.upstream == "active:50052"
    assert services["active"]["environment"]["VFLNET_ADVERTISE"] == f"proxy:{port(proxy.listen)}"
    assert all(services[name]["depends_on"]["proxy"] for name in PARTIES if name.startswith("passive"))
    assert services["certs"]["profiles"] == ["certs"]  # started by `run certs`, never by `up`
    certs = parse_vflnet(services["certs"]["command"])
    assert str(certs.out) == "/ca" and mounts(services["certs"])["/ca"] == "ca"
    assert str(certs.export) == "/parties"  # each party's own files, into the volume that party mounts
    assert all(mounts(services["certs"])[f"/parties/{name}"] == f"certs-{name}" for name in PARTIES)
    cfg = load_config(REPO / "configs" / "compose-tls.yaml")
    assert {(p.name, p.role) for p in certs.party} == {(p.name, p.role) for p in cfg.parties}


def test_deployment_configs_run_the_default_job() -> None:
    default = job(load_config(DEFAULT_CONFIG))
    for path in [
        REPO / "configs" / "compose.yaml",
        REPO / "configs" / "compose-tls.yaml",
        K8S / "config" / "run.yaml",
        LAB / "run.yaml",
    ]:
        cfg = load_config(path)
        assert job(cfg) == default, (
            f"{path.relative_to(REPO)} trains something else than {DEFAULT_CONFIG.name}"
        )
        assert cfg.run.id, f"{path.relative_to(REPO)}: processes started one by one must agree on run.id"
        assert [p.name for p in cfg.parties] == list(PARTIES)


def test_compose_files_overlay_mounts_each_party_its_own_file_only(tmp_path: Path) -> None:
    """deploy/compose.files.yml: the one-shot split writes each party's file into that party's volume;
    each party mounts only its own at /data (no passive container holds a label), the coordinator none;
    configs/compose-files.yaml is compose.yaml's job over those files."""
    from vflnet.data.sources import split_dataset

    services = compose_files(False, FILES_OVERLAY)["services"]
    split = services["split"]
    assert split["profiles"] == ["split"]  # started by `run split`, never by `up`
    argv = split["command"]
    parsed = parse_vflnet(argv)  # a valid `vflnet data split`
    assert parsed.action == "split" and str(parsed.out) == "/split"
    base = load_config(host_path(split, parsed.config))
    files = load_config(REPO / "configs" / "compose-files.yaml")
    for name in PARTIES:
        service = services[name]
        assert parse_vflnet(service["command"]).config == Path("/configs/compose-files.yaml")
        data = {target: source for target, source in mounts(service).items() if source.startswith("data-")}
        own = f"data-{name}"
        assert data == ({} if name == "coordinator" else {"/data": own}), (name, mounts(service))
        if name != "coordinator":
            assert mounts(split)[f"/split/{name}"] == own
            assert files.party(name).source.path == f"/data/{name}.csv"  # type: ignore[union-attr]
    sections = split_dataset(base, tmp_path, 0.7, 0)  # the columns the split writes
    for name, section in sections.items():
        source = files.party(name).source
        assert source is not None and source.features == section["features"], name
        assert source.label_column == section.get("label_column", "")
    assert files.alignment.method == "psi"
    mine, theirs = files.to_dict(), base.to_dict()
    for key in ("model", "train", "protocol", "predict"):
        assert mine[key] == theirs[key], key


# ------------------------------------------------------------------------------------------ Dockerfile
def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    joined = text.replace("\\\n", " ").splitlines()
    lines = [line.strip() for line in joined if line.strip() and not line.lstrip().startswith("#")]
    # the public base by default, pinned to a patch release (no floating tag like 3.11-slim);
    # tests/test_compose.py builds on a local one through the same ARG
    assert re.fullmatch(r"ARG BASE=python:3\.11\.\d+-slim-\w+", lines[0]) and lines[1] == "FROM ${BASE}"
    # CPU torch through the script scripts/setup.sh uses too, before the package pulls in PyPI's torch
    torch = lines.index("RUN bash scripts/install-torch.sh python")
    assert "COPY scripts/install-torch.sh ./scripts/" in lines[:torch]
    assert torch < next(i for i, line in enumerate(lines) if line.startswith("RUN pip install ."))
    copied = [part for line in lines if line.startswith("COPY ") for part in line.split()[1:-1]]
    for needed in ("pyproject.toml", "vflnet", "proto"):
        assert needed in copied
    for source in copied:
        assert (REPO / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    health = next(line for line in lines if line.startswith("HEALTHCHECK "))
    assert re.search(r"CMD vflnet health ", health)


# ------------------------------------------------------------------------------------------ Kubernetes
def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_k8s_every_container_runs_a_valid_vflnet_command() -> None:
    kustomization = next(d for d in k8s_docs() if d["kind"] == "Kustomization")
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file()
    (config_file,) = kustomization["configMapGenerator"][0]["files"]
    cfg = load_config(K8S / config_file.split("=", 1)[1])
    tls = cfg.transport.tls
    assert tls.enabled
    secrets = {s["name"]: s["files"] for s in kustomization["secretGenerator"]}
    services = {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == "Service"}
    claims = {d["metadata"]["name"] for d in k8s_docs() if d["kind"] == "PersistentVolumeClaim"}
    jobs = [d for d in k8s_docs() if d["kind"] in ("Job", "Deployment", "StatefulSet")]
    started = set()
    for workload in jobs:
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod.get("initContainers", []) + pod["containers"]:
            args = parse_vflnet(container["command"])
            mount_paths = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            if args.command == "health":
                assert mount_paths[str(PurePosixPath(args.ca).parent)] == "certs"
                continue
            assert args.command == "party"
            me = cfg.party(args.name)
            assert args.role == me.role
            assert str(args.config) == "/configs/run.yaml" and volumes[mount_paths["/configs"]]["configMap"]
            assert port(args.listen or me.address) == port(me.address)
            assert args.coordinator in (None, cfg.coordinator.address)
            host = me.address.rsplit(":", 1)[0]
            assert services[host]["spec"]["ports"][0]["port"] == port(me.address)
            assert services[host]["spec"]["selector"] == {"vflnet/party": args.name}
            assert workload["spec"]["template"]["metadata"]["labels"]["vflnet/party"] == args.name
            secret = volumes[mount_paths["/certs"]]["secret"]["secretName"]
            files = {f.split("=")[0] for f in secrets[secret]}
            wanted = {
                PurePosixPath(p).name
                for p in (tls.ca, tls.cert.format(name=me.name), tls.key.format(name=me.name))
            }
            assert files == wanted, f"{secret} must hold exactly this party's certificate, key and the CA"
            assert volumes[mount_paths["/runs"]]["persistentVolumeClaim"]["claimName"] in claims
            assert PurePosixPath(args.run_dir or cfg.run.dir).is_relative_to("/runs")
            probe = parse_vflnet(container["readinessProbe"]["exec"]["command"])
            assert probe.address == me.address
            assert probe.cert == tls.cert.format(name=me.name)
            started.add(args.name)
    assert started == set(PARTIES)


# ------------------------------------------------------------------------------------------ lab hosts
def read_env(path: Path) -> dict[str, str]:
    pairs = [
        line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")
    ]
    return {key: value for key, value in pairs}


def test_lab_hosts_match_the_lab_roster() -> None:
    cfg = load_config(LAB / "run.yaml")
    tls = cfg.transport.tls
    envs = {path.stem: read_env(path) for path in sorted((LAB / "hosts").glob("*.env"))}
    assert len(envs) == 4
    assert sorted(env["VFLNET_NAME"] for env in envs.values()) == sorted(PARTIES)
    for env in envs.values():
        me = cfg.party(env["VFLNET_NAME"])
        assert env["VFLNET_ROLE"] == me.role
        assert env["VFLNET_LISTEN"] == me.address
        assert env["VFLNET_CONFIG"] == "/etc/vflnet/run.yaml"
        assert env["VFLNET_COORDINATOR"] == ("" if me.role == "coordinator" else cfg.coordinator.address)
        assert me.address.rsplit(":", 1)[0] in env["VFLNET_CERT_HOSTS"].split(",")
        assert (env["VFLNET_CA"], env["VFLNET_CERT"], env["VFLNET_KEY"]) == (
            tls.ca,
            tls.cert.format(name=me.name),
            tls.key.format(name=me.name),
        )
        assert PurePosixPath(env["VFLNET_RUN_DIR"]) == PurePosixPath(cfg.run.dir)


@pytest.mark.parametrize("script", ["make-certs.sh", "start-party.sh"])
def test_lab_scripts_are_valid_shell(script: str) -> None:
    result = subprocess.run(["sh", "-n", str(LAB / script)], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------ CPU torch
INSTALL_TORCH = REPO / "scripts" / "install-torch.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_setup_installs_torch_with_the_script_before_the_package_with_every_extra() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text()
    call = setup.index('install-torch.sh" "$VENV/bin/python"')
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = re.search(r'pip install -q -e "\.\[([\w,]+)\]"', setup)
    assert install and call < install.start()
    assert sorted(install.group(1).split(",")) == sorted(extras)  # the tests and the demo use them all


def _install_torch(tmp_path: Path, *, cpu_index_up: bool, installed: bool = False) -> tuple[str, list[str]]:
    """Run scripts/install-torch.sh with a stand-in python that logs each call with the pip
    settings it saw, and installs (touches a file) unless the CPU index is down."""
    log, marker = tmp_path / "calls", tmp_path / "installed"
    if installed:
        marker.touch()
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$* | find-links=${{PIP_FIND_LINKS-unset}} config=${{PIP_CONFIG_FILE-unset}}" >> {log}\n'
        'case "$*" in\n'
        f'  *"m.version"*) [ -e {marker} ] && echo 2.13.0+cpu || exit 1 ;;\n'
        f"  *{CPU_INDEX}*) {f'touch {marker}' if cpu_index_up else 'exit 1'} ;;\n"
        f"  *) touch {marker} ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PIP_FIND_LINKS": "/opt/wheels"}
    out = subprocess.run(
        ["bash", str(INSTALL_TORCH), str(fake)], capture_output=True, text=True, env=env, timeout=30
    )
    assert out.returncode == 0, out.stderr
    calls = [c for c in log.read_text().splitlines() if " pip " in f" {c}"]
    return out.stdout + out.stderr, calls


def test_torch_comes_from_the_cpu_index_alone_when_it_is_reachable(tmp_path: Path) -> None:
    output, calls = _install_torch(tmp_path, cpu_index_up=True)
    # one pip call, with the local package sources left out
    assert calls == [
        f"-m pip install -q --timeout 10 --retries 0 --index-url {CPU_INDEX} torch==2.13.0"
        " | find-links=unset config=/dev/null"
    ]
    assert f"torch: 2.13.0+cpu installed from PyTorch's CPU index ({CPU_INDEX})" in output


def test_torch_falls_back_to_the_local_pip_configuration(tmp_path: Path) -> None:
    output, calls = _install_torch(tmp_path, cpu_index_up=False)
    assert len(calls) == 2 and CPU_INDEX in calls[0]
    assert calls[1] == "-m pip install -q torch==2.13.0 | find-links=/opt/wheels config=unset"
    assert "unreachable?" in output and "installed from the local pip configuration" in output


def test_installed_torch_is_kept(tmp_path: Path) -> None:
    output, calls = _install_torch(tmp_path, cpu_index_up=False, installed=True)
    assert calls == [] and "torch: 2.13.0+cpu is already installed" in output
