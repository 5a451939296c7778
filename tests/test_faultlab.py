"""The fault lab: per-host impairment changed mid-run, links that come back, `lab run --resume`.

The hub's shaping and the fault syntax are checked without root. The rest builds namespaces (root,
`ip netns`; skipped elsewhere with the reason), each torn down in a fixture whatever the test does.
The runs use short heartbeats (`heartbeat_s` 0.5, `dead_after_s` 10): a 2 s partition is ridden
out with 8 s to spare whatever the load (TCP's retransmission backoff brings the link's traffic
back within ~1.6 s of the link), and a partition that lasts fails the run within seconds.
"""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import base_config, write_config
from vflnet.tools.lab import cli
from vflnet.tools.lab.faults import FaultSchedule, parse_fault
from vflnet.tools.lab.netlab import (
    Lab,
    LabError,
    down,
    impair,
    impairments,
    in_netns,
    is_up,
    lab_processes,
    plan_hosts,
    unavailable_reason,
    up,
)
from vflnet.tools.lab.run import run_lab
from vflnet.tools.lab.switch import QUEUE_LIMIT, Impairment, Port, parse_impair, parse_netem

NO_LAB = unavailable_reason()
needs_lab = pytest.mark.skipif(NO_LAB is not None, reason=f"network lab unavailable: {NO_LAB}")
LAB_RUN_TIMEOUT_S = 600  # a whole lab run on a loaded machine: minutes to start four processes
DEAD_AFTER_S = 10.0
PARTIES = ("active", "passive-1", "passive-2")


# ---------------------------------------------------------------------------------- no root needed
def test_the_hub_reads_jitter_and_rate_in_netem_and_impair_syntax() -> None:
    assert parse_netem("delay 100ms 10ms loss 1% rate 10mbit") == Impairment(
        delay_s=0.1, jitter_s=0.01, loss=0.01, rate_bps=10e6
    )
    assert parse_netem("rate 1500kbit") == Impairment(rate_bps=1.5e6)
    for bad in ("duplicate 1%", "reorder 25%", "rate 1mbps", "rate 0mbit", "delay 1ms -2ms"):
        with pytest.raises(ValueError):
            parse_netem(bad)
    imp = parse_impair(["delay=20ms", "jitter=5ms", "loss=1%", "rate=10mbit"])
    assert imp == Impairment(delay_s=0.02, jitter_s=0.005, loss=0.01, rate_bps=10e6)
    assert isinstance(imp, Impairment) and parse_impair(imp.spec().split()) == imp
    assert parse_impair(["clear"]) == Impairment() and Impairment().spec() == "clear"
    assert parse_impair(["down"]) == "down" and parse_impair(["up"]) == "up"
    for bad in (["down", "up"], ["delay=5"], ["speed=1mbit"], ["delay=1ms", "delay=2ms"], [], ["loss=1"]):
        with pytest.raises(ValueError):
            parse_impair(bad)


def _port(impairment: Impairment) -> Port:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.close()  # shaping never touches it
    return Port("p0", sock, impairment)


def test_a_ports_rate_spaces_its_frames_and_its_jitter_never_reorders_them() -> None:
    rng = random.Random(0)
    port = _port(Impairment(delay_s=0.1, rate_bps=1e6))
    # 1250 B at 1 Mbit/s take 10 ms on the link: a burst leaves 10 ms apart, each 100 ms later
    assert [port.due(0.0, 1250, rng) for _ in range(3)] == pytest.approx([0.11, 0.12, 0.13])
    assert port.due(1.0, 1250, rng) == pytest.approx(1.11)  # an idle link sends at once
    port = _port(Impairment(delay_s=0.01, jitter_s=0.01))
    dues = [port.due(i * 0.001, 100, rng) for i in range(2000)]
    assert all(d is not None for d in dues)
    assert dues == sorted(dues)  # type: ignore[type-var]
    assert all(i * 0.001 <= d <= i * 0.001 + 0.02 for i, d in enumerate(dues))  # type: ignore[operator]
    assert len({round(d - i * 0.001, 4) for i, d in enumerate(dues)}) > 50  # type: ignore[operator]


def test_a_port_that_is_down_lossy_or_full_drops_frames() -> None:
    rng = random.Random(0)
    port = _port(Impairment(loss=1.0))
    assert port.due(0.0, 100, rng) is None
    port = _port(Impairment(loss=0.25))
    kept = sum(port.due(0.0, 100, rng) is not None for _ in range(4000))
    assert 2800 < kept < 3200
    port = _port(Impairment())
    port.up = False
    assert port.due(0.0, 100, rng) is None
    port = _port(Impairment())
    port.queued = QUEUE_LIMIT
    assert port.due(0.0, 100, rng) is None


def _paper_lab(emulator: str = "userspace") -> Lab:
    roster = [("coordinator", "coordinator"), ("active", "active"), ("passive-1", "passive")]
    return Lab(
        prefix="vx",
        lab_dir="/nonexistent",
        source_config="/nonexistent.yaml",
        switch_ns="vx-sw",
        hosts=plan_hosts(roster, "vx", proxy_host=False),
        emulator=emulator,
        control="/run/vflnet-lab/vx.hub" if emulator == "userspace" else "",
    )


def test_a_fault_names_a_step_a_host_and_settings_and_anything_else_is_refused_by_name() -> None:
    lab = _paper_lab()
    fault = parse_fault("step 20: passive-1 down for 10s", lab)
    assert (fault.step, fault.party, fault.settings, fault.for_s, fault.link) == (
        20,
        "passive-1",
        ("down",),
        10.0,
        True,
    )
    fault = parse_fault("step 5: active delay=50ms jitter=10ms", lab)
    assert (fault.settings, fault.for_s, fault.link) == (("delay=50ms", "jitter=10ms"), None, False)
    refused = {
        "at 20: passive-1 down": "expected 'step N: PARTY SETTING",
        "step 2: passive-9 down": "no host 'passive-9'",
        "step 2: active down up": "setting 'down'",
        "step 2: active delay=5": "bad time '5'",
        "step 2: active down for ever": "bad time 'ever'",
    }
    for text, why in refused.items():
        with pytest.raises(LabError, match=why):
            parse_fault(text, lab)
    for emulator, kernel in (("none", "a bridge"), ("netem", "tc netem")):
        with pytest.raises(LabError, match=f"kernel \\({kernel}\\).*--emulator userspace"):
            parse_fault("step 1: active down", _paper_lab(emulator))


def test_a_fault_whose_step_the_run_never_reached_is_reported_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lab = _paper_lab()
    schedule = FaultSchedule(lab, [parse_fault("step 99: active down", lab)], tmp_path)
    schedule.start()
    records = [{"kind": "epoch", "epoch": 0}, *({"kind": "step", "step": i} for i in range(1, 6))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    deadline = time.monotonic() + 60
    while schedule.last_step < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert schedule.stop() == ["fault 'step 99: active down' never fired: the run's last step was 5"]
    assert "never fired" in capsys.readouterr().err
    assert not (tmp_path / "faults.jsonl").exists()


def test_lab_run_wants_a_target_or_resume_and_resume_wants_a_lab_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run"])
    assert exit_.value.code == 2
    assert "give CONFIG|LABDIR, or --resume RUN_DIR" in capsys.readouterr().err
    for option in (["--tls"], ["--netem", "delay 1ms"], ["--prefix", "other"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["run", "--resume", str(tmp_path), *option])
        assert exit_.value.code == 2
        assert f"{option[0]} cannot be changed: the run resumes with the options" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("{}\n")
    assert cli.main(["run", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has no lab.json: not a run directory of `vflnet lab run`" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------- helpers
def _prefix() -> str:
    return f"fl{uuid.uuid4().hex[:8]}"


def _config(tmp_path: Path) -> Path:
    """One epoch of digits in 90 steps of 16 (long enough for a fault at step 3 or 12 to land
    mid-run), a checkpoint every 10 steps, heartbeats that find a partition in seconds."""
    data = base_config()
    data["train"].update(batch_size=16, checkpoint_every_steps=10)
    data["transport"].update(heartbeat_s=0.5, dead_after_s=DEAD_AFTER_S)
    return write_config(tmp_path, data)


def _in(lab: Lab, host: str, fn: Callable[[], Any]) -> Any:
    return in_netns(lab.host(host).ns, fn)


def _handshake_s(lab: Lab, src: str, dst: str, timeout: float = 10.0) -> float:
    """Seconds for a TCP handshake from ``src`` to a listener on ``dst`` (OSError if none comes)."""
    target = lab.host(dst)
    listener = _in(lab, dst, lambda: socket.create_server((target.address, 9999)))
    try:

        def connect() -> float:
            start = time.monotonic()
            with socket.create_connection((target.address, 9999), timeout=timeout):
                return time.monotonic() - start

        return _in(lab, src, connect)  # type: ignore[no-any-return]
    finally:
        listener.close()


def _send_s(lab: Lab, src: str, dst: str, size: int) -> float:
    """Seconds from ``src``'s connect until ``dst`` has received ``size`` bytes and the close."""
    target = lab.host(dst)
    listener = _in(lab, dst, lambda: socket.create_server((target.address, 9998)))
    received: list[int] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            total = 0
            while chunk := conn.recv(1 << 16):
                total += len(chunk)
            received.append(total)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:

        def send() -> float:
            start = time.monotonic()
            with socket.create_connection((target.address, 9998), timeout=30) as conn:
                conn.sendall(b"x" * size)
            server.join(timeout=60)
            return time.monotonic() - start

        seconds: float = _in(lab, src, send)
    finally:
        listener.close()
    assert received == [size]
    return seconds


def _final(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    return summary["final"]  # type: ignore[no-any-return]


def _assert_identical(run: Path, reference: Path) -> None:
    """Final metrics and every checkpointed parameter bit for bit."""
    got, want = _final(run), _final(reference)
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "steps"):
        assert got[key] == want[key], key
    for party in PARTIES:
        a = torch.load(run / "checkpoints" / f"{party}.pt", weights_only=True)["modules"]
        b = torch.load(reference / "checkpoints" / f"{party}.pt", weights_only=True)["modules"]
        assert a.keys() == b.keys() and a, party
        for module in a:
            for key, tensor in a[module].items():
                assert torch.equal(tensor, b[module][key]), f"{party} {module}.{key}"


def _faults(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]


def _step_times(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step_time_s"] for r in records if r.get("kind") == "step"]


@pytest.fixture(scope="module")
def fault_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if NO_LAB is not None:
        pytest.skip(f"network lab unavailable: {NO_LAB}")
    tmp = tmp_path_factory.mktemp("faultlab")
    prefix = _prefix()
    try:
        yield up(_config(tmp), prefix=prefix, lab_dir=tmp / "lab", emulator="userspace")
    finally:
        down(prefix)


@pytest.fixture(scope="module")
def reference(fault_lab: Lab) -> Path:
    """The unimpaired run every faulted one must match."""
    result = run_lab(fault_lab, timeout_s=LAB_RUN_TIMEOUT_S)
    assert result.rc == 0
    return result.run_dir


# ------------------------------------------------------------------------------- links, no runs
@pytest.mark.netns
@pytest.mark.e2e
@needs_lab
def test_impair_changes_one_hosts_link_now_and_a_link_taken_down_comes_back(tmp_path: Path) -> None:
    prefix = _prefix()
    try:
        lab = up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab", emulator="userspace")
        assert impair(lab, "active", ["delay=100ms"]) == {"up": True, "impairment": "delay=100ms"}
        # the handshake's reply leaves through active's impaired egress; the request does not
        assert _handshake_s(lab, "coordinator", "active") >= 0.099
        assert impair(lab, "active", ["clear"])["impairment"] == "clear"
        assert impair(lab, "coordinator", ["rate=10mbit"])["impairment"] == "rate=10mbit"
        assert _send_s(lab, "coordinator", "active", 1_000_000) >= 0.75  # 8 Mbit at 10 Mbit/s
        impair(lab, "coordinator", ["clear"])

        assert impair(lab, "passive-1", ["down"]) == {"up": False, "impairment": "clear"}
        with pytest.raises(OSError):
            _handshake_s(lab, "coordinator", "passive-1", timeout=1.0)
        with pytest.raises(OSError):
            _handshake_s(lab, "passive-1", "active", timeout=1.0)
        assert impairments(lab)["passive-1"]["up"] is False
        assert impair(lab, "passive-1", ["up"])["up"] is True
        assert _handshake_s(lab, "coordinator", "passive-1") < 10
        assert _handshake_s(lab, "passive-1", "active") < 10

        assert cli.main(["impair", "--prefix", prefix, "passive-2", "loss=100%"]) == 0
        with pytest.raises(OSError):
            _handshake_s(lab, "passive-2", "active", timeout=1.0)
        assert cli.main(["impair", "--prefix", prefix, "passive-2", "clear"]) == 0
        assert _handshake_s(lab, "passive-2", "active") < 10
        assert cli.main(["impair", "--prefix", prefix, "passive-2", "delay=1"]) == 2
    finally:
        down(prefix)


@pytest.mark.netns
@pytest.mark.e2e
@needs_lab
def test_a_hub_port_whose_veth_went_down_carries_traffic_once_it_is_up_again(tmp_path: Path) -> None:
    """The hub used to close a port for good on any socket error, ENETDOWN included."""
    prefix = _prefix()
    try:
        lab = up(
            _config(tmp_path),
            prefix=prefix,
            lab_dir=tmp_path / "lab",
            netem="delay 1ms",
            emulator="userspace",
        )
        assert _handshake_s(lab, "coordinator", "active") < 10
        port = lab.host("active").switch_port
        for state in ("down", "up"):
            subprocess.run(["ip", "-n", lab.switch_ns, "link", "set", port, state], check=True, timeout=30)
        # traffic from active reaches the hub's socket on that port again (it has not closed it)
        assert _handshake_s(lab, "coordinator", "active") < 10
        assert _handshake_s(lab, "active", "passive-1") < 10
    finally:
        down(prefix)


# ------------------------------------------------------------------------------ faults mid-run
@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
def test_a_partition_shorter_than_dead_after_s_is_ridden_out_with_an_identical_result(
    fault_lab: Lab, reference: Path
) -> None:
    result = run_lab(fault_lab, faults=["step 3: passive-1 down for 2s"], timeout_s=LAB_RUN_TIMEOUT_S)
    assert result.rc == 0
    done = _faults(result.run_dir)
    assert [(f["set"], f["state"]["up"]) for f in done] == [("down", False), ("up", True)]
    assert done[1]["time"] - done[0]["time"] >= 2.0
    assert max(_step_times(result.run_dir)) >= 1.9  # a step waited the partition out
    assert impairments(fault_lab)["passive-1"] == {"up": True, "impairment": "clear"}
    _assert_identical(result.run_dir, reference)


@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
def test_loss_and_jitter_on_every_host_give_an_identical_result(fault_lab: Lab, reference: Path) -> None:
    hosts = [h.name for h in fault_lab.hosts]
    # for longer than any run: undone when the run ends, so the lab is clean for the next test
    faults = [f"step 1: {h} delay=2ms jitter=2ms loss=1% for 3600s" for h in hosts]
    result = run_lab(fault_lab, faults=faults, timeout_s=LAB_RUN_TIMEOUT_S)
    assert result.rc == 0
    set_ = [f for f in _faults(result.run_dir) if f["why"].startswith("step")]
    assert sorted(f["party"] for f in set_) == sorted(hosts)
    assert {f["state"]["impairment"] for f in set_} == {"delay=2ms jitter=2ms loss=1%"}
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert max(_step_times(result.run_dir)) < summary["step_deadline_s"]  # every step within its deadline
    assert {s["impairment"] for s in impairments(fault_lab).values()} == {"clear"}
    _assert_identical(result.run_dir, reference)


@pytest.mark.netns
@pytest.mark.e2e
@pytest.mark.slow
@needs_lab
def test_a_partition_that_lasts_fails_the_run_naming_the_party_and_lab_run_resume_completes_it(
    tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = _prefix()
    try:
        lab = up(_config(tmp_path), prefix=prefix, lab_dir=tmp_path / "lab", emulator="userspace")
        failed = run_lab(lab, faults=["step 12: passive-1 down"], timeout_s=LAB_RUN_TIMEOUT_S)
        assert failed.rc == 1
        summary = json.loads((failed.run_dir / "summary.json").read_text())
        assert summary["status"] == "failed"
        assert "'passive-1'" in summary["error"] and "heartbeats" in summary["error"]
        assert "FAILED" in capsys.readouterr().err
        assert lab_processes(lab) == {}
        assert impairments(lab)["passive-1"]["up"] is False  # a fault without a duration stays
    finally:
        down(prefix)
    # the lab is gone: --resume brings it up again from the run's lab.json (a fresh hub: every link
    # up) and takes it down after
    assert cli.main(["run", "--resume", str(failed.run_dir), "--timeout", str(LAB_RUN_TIMEOUT_S)]) == 0
    err = capsys.readouterr().err
    resumed = re.search(r"resuming from step (\d+)", err)
    assert resumed is not None and int(resumed[1]) >= 10, err[-3000:]  # a checkpoint, not the start
    assert not is_up(lab)
    _assert_identical(failed.run_dir, reference)
