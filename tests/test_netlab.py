"""The network lab: parties in their own network namespaces, latency and loss, a proxy on the path.

The tests that build namespaces need root and `ip netns`; elsewhere they are skipped with the reason.
Every lab gets a unique prefix and is torn down in a fixture, whatever the test does.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import base_config, write_config
from vflnet.interceptors.trace import read_trace, trace_path
from vflnet.tools.lab import cli, netlab
from vflnet.tools.lab.netlab import (
    SUBNET,
    Lab,
    LabError,
    down,
    in_netns,
    lab_processes,
    plan_hosts,
    unavailable_reason,
    up,
)
from vflnet.tools.lab.run import LabRunResult, run_lab
from vflnet.tools.lab.switch import Impairment, parse_netem
from vflnet.wire import tensors

NO_LAB = unavailable_reason()
HAS_PROXY = importlib.util.find_spec("vflnet.roles.proxy") is not None
needs_lab = pytest.mark.skipif(NO_LAB is not None, reason=f"network lab unavailable: {NO_LAB}")
needs_proxy = pytest.mark.skipif(not HAS_PROXY, reason="vflnet.roles.proxy is not in this tree")
LAB_RUN_TIMEOUT_S = 600  # a whole lab run (three steps) on a loaded machine: minutes to start five processes


# ---------------------------------------------------------------------------------- no root needed
def test_parse_netem_reads_delay_and_loss_and_rejects_what_it_cannot_emulate() -> None:
    assert parse_netem("delay 100ms loss 1%") == Impairment(delay_s=0.1, loss=0.01)
    assert parse_netem("loss 0.5% delay 2s") == Impairment(delay_s=2.0, loss=0.005)
    assert parse_netem("") == Impairment()
    for bad in ("duplicate 1%", "delay", "delay 100", "loss 1", "loss 150%", "delay -1ms"):
        with pytest.raises(ValueError):
            parse_netem(bad)


def test_plan_gives_each_party_its_own_namespace_address_and_port() -> None:
    roster = [
        ("coordinator", "coordinator"),
        ("active", "active"),
        ("passive-1", "passive"),
        ("passive 2", "passive"),
    ]
    hosts = plan_hosts(roster, "vx", proxy_host=True)
    assert [h.ns for h in hosts] == [
        "vx-coordinator",
        "vx-active",
        "vx-passive-1",
        "vx-passive_2",
        "vx-proxy",
    ]
    assert len({h.address for h in hosts}) == len(hosts)
    assert all(ipaddress.ip_address(h.address) in SUBNET for h in hosts)
    assert [h.port for h in hosts] == [50051, 50052, 50053, 50054, 50060]
    assert [h.switch_port for h in hosts] == ["p0", "p1", "p2", "p3", "p4"]
    with pytest.raises(LabError, match="proxy"):
        plan_hosts([*roster, ("proxy", "passive")], "vx", proxy_host=True)
    with pytest.raises(LabError, match="distinct"):
        plan_hosts([("a b", "active"), ("a_b", "passive")], "vx", proxy_host=False)


# --------------------------------------------------------------------------------------- helpers
def _config(tmp_path: Path) -> Path:
    """One epoch of digits in three 512-sample steps: quick even at 100 ms per hop."""
    data = base_config()
    data["train"].update(batch_size=512)
    return write_config(tmp_path, data)


def _prefix() -> str:
    return f"nt{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def proxy_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if NO_LAB is not None:
        pytest.skip(f"network lab unavailable: {NO_LAB}")
    tmp = tmp_path_factory.mktemp("netlab")
    prefix = _prefix()
    try:
        yield up(_config(tmp), prefix=prefix, lab_dir=tmp / "lab", proxy_host=True)
    finally:
        down(prefix)


@pytest.fixture(scope="module")
def plain_run(proxy_lab: Lab) -> LabRunResult:
    """The reference run: plaintext, no impairment, through the honest gRPC proxy when there is one."""
    return run_lab(proxy_lab, via="active" if HAS_PROXY else None, timeout_s=LAB_RUN_TIMEOUT_S)


def _final(result: LabRunResult) -> dict[str, Any]:
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    return summary["final"]


def _same_checkpoints(a: Path, b: Path) -> bool:
    for party in ("active", "passive-1", "passive-2"):
        ma = torch.load(a / "checkpoints" / f"{party}.pt", weights_only=True)["modules"]
        mb = torch.load(b / "checkpoints" / f"{party}.pt", weights_only=True)["modules"]
        assert ma.keys() == mb.keys() and ma, party
        for module in ma:
            for key, tensor in ma[module].items():
                if not torch.equal(tensor, mb[module][key]):
                    return False
    return True


def _relay_counts(result: LabRunResult) -> tuple[int, int]:
    """(bytes relayed upstream, vflnet messages recognised) from the TCP relay's closing line."""
    log = (result.run_dir / "logs" / "proxy.log").read_text()
    found = re.search(r"relayed \d+ connections, (\d+) B up, \d+ B down, (\d+) vflnet messages seen", log)
    assert found, log[-2000:]
    return int(found[1]), int(found[2])


def _connect_seconds(lab: Lab, src: str, dst: str) -> float:
    """Time for a TCP handshake from host ``src`` to a listener on host ``dst``."""
    target = lab.host(dst)
    listener = in_netns(target.ns, lambda: socket.create_server((target.address, 9999)))
    try:

        def connect() -> float:
            start = time.monotonic()
            with socket.create_connection((target.address, 9999), timeout=10):
                return time.monotonic() - start

        return in_netns(lab.host(src).ns, connect)
    finally:
        listener.close()


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


# ------------------------------------------------------------------------------------ lab plumbing
@pytest.mark.netns
@needs_lab
def test_up_builds_isolated_hosts_and_down_removes_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = _prefix()
    before = _root_links()
    try:
        assert (
            cli.main(["up", str(_config(tmp_path)), "--prefix", prefix, "--dir", str(tmp_path / "lab")]) == 0
        )
        lab = Lab.open(tmp_path / "lab")
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for ns in lab.namespaces:
            assert ns in listed
        for h in lab.hosts:
            routes = subprocess.run(["ip", "-n", h.ns, "route"], capture_output=True, text=True).stdout
            assert (
                f"{h.address}"
                in subprocess.run(["ip", "-n", h.ns, "addr"], capture_output=True, text=True).stdout
            )
            assert "default" not in routes and str(SUBNET) in routes  # no way off the lab subnet
        assert _root_links() == before  # the host's own namespace is untouched
        generated = (tmp_path / "lab" / "config.yaml").read_text()
        assert f"address: {lab.host('coordinator').address}:50051" in generated
        assert "allow_plaintext_remote: true" in generated
        with pytest.raises(LabError, match="already up"):
            up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab2")
    finally:
        assert cli.main(["down", "--prefix", prefix]) == 0
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in listed
    assert cli.main(["down", "--prefix", prefix]) == 0  # idempotent
    assert "no lab with prefix" in capsys.readouterr().out


@pytest.mark.netns
@needs_lab
def test_tcp_cc_sets_every_hosts_congestion_control_and_a_refused_one_says_what_is_allowed(
    tmp_path: Path,
) -> None:
    prefix = _prefix()

    def cc(ns: str) -> str:
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_congestion_control"],
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    try:
        lab = up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab", tcp_cc="reno")
        assert Lab.open(tmp_path / "lab").tcp_cc == "reno"
        assert {cc(h.ns) for h in lab.hosts} == {"reno"}
    finally:
        down(prefix)
    # refused before anything is built, naming what a namespace may use
    with pytest.raises(LabError, match="'no-such-cc' cannot be set in the lab's namespaces: it is not among"):
        up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab2", tcp_cc="no-such-cc")
    sysctls = Path("/proc/sys/net/ipv4")
    allowed = (sysctls / "tcp_allowed_congestion_control").read_text().split()
    loaded_only = set((sysctls / "tcp_available_congestion_control").read_text().split()) - set(allowed)
    if loaded_only:  # loaded but not allowed: cubic where the machine allows reno bbr
        name = min(loaded_only)
        with pytest.raises(LabError, match=f"'{name}'.*may use only net.ipv4.tcp_allowed_congestion_control"):
            up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab3", tcp_cc=name)
    assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not (tmp_path / "lab2").exists() and not (tmp_path / "lab3").exists()


def test_a_congestion_control_a_namespace_may_not_use_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the machine's own namespace the kernel answers EPERM for any congestion control not in
    tcp_allowed_congestion_control, loaded or not: `tcp_cc_refusal` says which case, before a lab starts."""
    (tmp_path / "tcp_allowed_congestion_control").write_text("reno bbr\n")
    (tmp_path / "tcp_available_congestion_control").write_text("reno bbr cubic\n")
    monkeypatch.setattr(netlab, "TCP_CC_SYSCTLS", tmp_path)
    assert netlab.tcp_cc_refusal("") is None and netlab.tcp_cc_refusal("bbr") is None
    cubic = netlab.tcp_cc_refusal("cubic")
    assert cubic is not None and "'cubic' cannot be set" in cubic and "(reno bbr)" in cubic
    assert "tcp_allowed_congestion_control='reno bbr cubic'" in cubic  # the sysctl that would allow it
    vegas = netlab.tcp_cc_refusal("vegas")
    assert vegas is not None and "not among the kernel's loaded ones" in vegas and "reno bbr cubic" in vegas
    (tmp_path / "tcp_allowed_congestion_control").unlink()  # cannot tell: the namespace's sysctl will
    assert netlab.tcp_cc_refusal("vegas") is None


# ---------------------------------------------------------------------------- demo 1: a slow network
@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
def test_training_over_100ms_and_1pct_loss_ends_exactly_where_it_does_without(
    tmp_path: Path, plain_run: LabRunResult
) -> None:
    prefix = _prefix()
    try:
        lab = up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab", netem="delay 100ms loss 1%")
        assert lab.emulator in ("netem", "userspace")
        # a TCP handshake crosses two impaired egresses: it cannot take less than 2 x 100 ms
        assert _connect_seconds(lab, "coordinator", "active") >= 0.19
        slow = run_lab(lab, timeout_s=LAB_RUN_TIMEOUT_S)
        assert slow.rc == 0
        assert lab_processes(lab) == {}  # the run tore its processes down
    finally:
        down(prefix)
    assert plain_run.rc == 0
    slow_final, plain_final = _final(slow), _final(plain_run)
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "steps"):
        assert slow_final[key] == plain_final[key], key
    assert _same_checkpoints(slow.run_dir, plain_run.run_dir)


# --------------------------------------------------------------------- demo 2: a proxy on the path
@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
@needs_proxy
def test_plaintext_proxy_reads_the_embeddings(plain_run: LabRunResult) -> None:
    assert plain_run.rc == 0
    events = list(read_trace(trace_path(plain_run.run_dir, "proxy")))
    seen = [e for e in events if e.short_method == "ExchangeEmbeddings" and e.direction == "request"]
    assert {e.sender for e in seen} == {"passive-1", "passive-2"}
    values = tensors.from_proto(seen[0].tensor_protos()["values"])
    assert values.shape == (512, 16) and float(abs(values).sum()) > 0


@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
@needs_proxy
def test_plaintext_proxy_can_tamper_and_the_run_never_notices(
    proxy_lab: Lab, plain_run: LabRunResult
) -> None:
    tampered = run_lab(proxy_lab, via="active", tamper=True, timeout_s=LAB_RUN_TIMEOUT_S)
    assert tampered.rc == 0  # nothing on a plaintext channel can tell
    assert _final(tampered)["test_loss"] != _final(plain_run)["test_loss"]
    assert not _same_checkpoints(tampered.run_dir, plain_run.run_dir)


@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
@needs_proxy
def test_mtls_relay_sees_only_ciphertext_and_changes_nothing(proxy_lab: Lab, plain_run: LabRunResult) -> None:
    relayed = run_lab(proxy_lab, via="active", tls=True, proxy_mode="tcp", timeout_s=LAB_RUN_TIMEOUT_S)
    assert relayed.rc == 0
    assert _same_checkpoints(relayed.run_dir, plain_run.run_dir)
    bytes_up, messages = _relay_counts(relayed)
    assert bytes_up > 100_000 and messages == 0  # every embedding crossed it; it recognised none


@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
@needs_proxy
def test_mtls_run_fails_rather_than_accept_tampered_bytes(proxy_lab: Lab) -> None:
    tampered = run_lab(
        proxy_lab, via="active", tls=True, proxy_mode="tcp", tamper=True, timeout_s=LAB_RUN_TIMEOUT_S
    )
    assert tampered.rc == 1
    summary = json.loads((tampered.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    active_log = (tampered.run_dir / "logs" / "active.log").read_text()
    assert "BAD_RECORD_MAC" in active_log or "DATA_CORRUPTED" in active_log  # TLS caught the flipped bit
    assert lab_processes(proxy_lab) == {}
