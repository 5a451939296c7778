"""Heartbeats (vflnet/roles/heartbeat.py): a dead coordinator stops the parties, a stopped party fails
the run within transport.dead_after_s, and a slow peer is not dead."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from tests.conftest import DEADLINES, base_config, write_config
from vflnet.roles.heartbeat import Abort, Heartbeat, HeartbeatError
from vflnet.sdk.contract import RunFailed

HEARTBEAT_S, DEAD_AFTER_S = 0.2, 3.0
RPC_TIMEOUT_S = 300  # far above dead_after_s: a dead peer found by a deadline would fail the test


# ------------------------------------------------------------------------------ in-process units
def _beat(check, dead_after_s: float = 0.5) -> tuple[Heartbeat, threading.Event, list[str]]:
    dead, why = threading.Event(), []

    def on_dead(silent_s: float, error: str) -> None:
        why.append(f"{silent_s:.1f} {error}")
        dead.set()

    return Heartbeat("peer", check, 0.05, dead_after_s, on_dead).start(), dead, why


def test_a_peer_that_never_answers_is_dead_after_dead_after_s():
    def refuse(timeout: float) -> None:
        raise HeartbeatError("UNAVAILABLE: connection refused")

    start = time.monotonic()
    beat, dead, why = _beat(refuse)
    assert dead.wait(10), "never declared dead"
    assert time.monotonic() - start >= 0.5
    assert "connection refused" in why[0]
    beat.stop()


def test_a_slow_peer_that_answers_is_not_dead():
    def slow(timeout: float) -> None:
        time.sleep(0.1)  # answers, slowly: a peer busy with a long step

    beat, dead, _ = _beat(slow, dead_after_s=0.3)
    assert not dead.wait(1.5)
    beat.stop()


def test_one_answer_resets_the_count():
    answers = iter([False] * 4 + [True] + [False] * 1000)

    def flaky(timeout: float) -> None:
        if not next(answers):
            raise HeartbeatError("DEADLINE_EXCEEDED")

    start = time.monotonic()
    beat, dead, _ = _beat(flaky, dead_after_s=0.5)
    assert dead.wait(10)
    # four failures (~0.2 s), one answer, then 0.5 s of failures: more than dead_after_s in all
    assert time.monotonic() - start >= 0.65
    beat.stop()


def test_silence_while_this_process_was_paused_is_not_the_peers():
    paused = iter([True])

    def resumed_then_refused(timeout: float) -> None:
        if next(paused, False):  # a check that outlives its deadline: this process was stopped
            time.sleep(timeout + 2.5)
        raise HeartbeatError("CANCELLED")

    start = time.monotonic()
    beat, dead, _ = _beat(resumed_then_refused, dead_after_s=0.5)
    assert dead.wait(20)
    # dead_after_s of failures counted from the resumption, not from before the pause
    assert time.monotonic() - start >= 0.125 + 2.5 + 0.5
    beat.stop()


def test_abort_wakes_a_wait_and_says_why():
    calls = [Future(), Future()]
    abort = Abort()
    settled = threading.Semaphore(0)
    for call in calls:
        call.add_done_callback(lambda _c: settled.release())
    abort.track(calls)
    threading.Timer(0.1, abort.fire, ["party 'p1' has not answered heartbeats for 3 s"]).start()
    assert settled.acquire(timeout=10)
    assert all(c.cancelled() for c in calls)
    with pytest.raises(RunFailed, match="p1"):
        abort.check()
    later = [Future()]  # a wait begun after the abort ends at once
    abort.track(later)
    assert later[0].cancelled()


# ------------------------------------------------------------------------------------ real runs
def _start_long_run(tmp_path: Path, repo: Path) -> tuple[subprocess.Popen, Path, dict]:
    """A run far longer than the test, with fast heartbeats; returned once it has taken a step."""
    data = base_config(n_passive=2)
    data["train"].update(epochs=500, batch_size=16)
    data["transport"].update(heartbeat_s=HEARTBEAT_S, dead_after_s=DEAD_AFTER_S, rpc_timeout_s=RPC_TIMEOUT_S)
    path = write_config(tmp_path, data)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflnet", "run", str(path), "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
    )
    # metrics.jsonl's first line is the first step done; starting and joining is bounded by join_timeout_s
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + DEADLINES["join_timeout_s"] + 60
    while not (metrics.exists() and '"kind": "step"' in metrics.read_text()):
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before a step: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the run took no step in time")
        time.sleep(0.2)
    pids = json.loads((run_dir / "processes.json").read_text())
    return proc, run_dir, pids


def _exit_time(pid: int, timeout_s: float) -> float | None:
    """Seconds until ``pid`` ends (a pidfd turns readable then, zombie or not), None if not within ``timeout_s``."""
    start = time.monotonic()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0.0
    try:
        ended, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    return time.monotonic() - start if ended else None


def _stop_all(proc: subprocess.Popen, pids: dict) -> None:
    for info in pids.values():
        try:
            os.kill(info["pid"], signal.SIGCONT)
            os.kill(info["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.communicate()


def _start_roles_one_by_one(tmp_path: Path, repo: Path) -> tuple[Path, dict[str, subprocess.Popen]]:
    """The long run's roles started as compose and lab machines start them (`vflnet party`, no
    launcher to watch them); returned once it has taken a step."""
    from vflnet.runner.local import free_port

    data = base_config(n_passive=2)
    data["run"]["id"] = "heartbeat"
    data["train"].update(epochs=500, batch_size=16)
    data["transport"].update(heartbeat_s=HEARTBEAT_S, dead_after_s=DEAD_AFTER_S, rpc_timeout_s=RPC_TIMEOUT_S)
    coordinator = f"127.0.0.1:{free_port()}"
    path = write_config(tmp_path, data)
    run_dir = tmp_path / "run"
    procs: dict[str, subprocess.Popen] = {}
    for party in data["parties"]:
        where = (
            ["--listen", coordinator]
            if party["role"] == "coordinator"
            else ["--listen", "127.0.0.1:0", "--advertise", "127.0.0.1:0", "--coordinator", coordinator]
        )
        log = (tmp_path / f"{party['name']}.log").open("w")
        procs[party["name"]] = subprocess.Popen(
            [sys.executable, "-m", "vflnet", "party", "--role", party["role"], "--config", str(path)]
            + ["--name", party["name"], "--run-dir", str(run_dir), *where],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=repo,
        )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + DEADLINES["join_timeout_s"] + 60
    while not (metrics.exists() and '"kind": "step"' in metrics.read_text()):
        exited = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        if exited or time.monotonic() > deadline:
            for p in procs.values():
                p.kill()
            raise AssertionError(f"no step in time (exited: {exited})")
        time.sleep(0.1)
    return tmp_path, procs


@pytest.mark.e2e
def test_parties_stop_soon_after_the_coordinator_dies(tmp_path, repo):
    logs, procs = _start_roles_one_by_one(tmp_path, repo)
    try:
        procs["coordinator"].kill()
        killed = time.monotonic()
        for name, proc in procs.items():
            if name == "coordinator":
                continue
            took = _exit_time(proc.pid, DEAD_AFTER_S + 10 - (time.monotonic() - killed))
            assert took is not None, f"{name} still runs {DEAD_AFTER_S + 10:.0f} s after the coordinator died"
            proc.wait()
            assert proc.returncode == 3, (name, proc.returncode)
            log = (logs / f"{name}.log").read_text()
            assert "unreachable for" in log and ": stopping" in log, log[-2000:]
        # not the idle timeout (600 s) and not before dead_after_s
        assert DEAD_AFTER_S <= time.monotonic() - killed < DEAD_AFTER_S + 10
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.e2e
def test_a_stopped_party_fails_the_run_within_dead_after_s(tmp_path, repo):
    proc, run_dir, pids = _start_long_run(tmp_path, repo)
    try:
        os.kill(pids["passive-1"]["pid"], signal.SIGSTOP)  # alive, answers nothing
        stopped = time.monotonic()
        coordinator_log = Path(pids["coordinator"]["log"])
        deadline = stopped + DEAD_AFTER_S + 15
        while "run failed" not in coordinator_log.read_text():
            assert time.monotonic() < deadline, "the run did not fail within dead_after_s + 15 s"
            time.sleep(0.1)
        took = time.monotonic() - stopped
        assert DEAD_AFTER_S <= took < RPC_TIMEOUT_S
        failed = [line for line in coordinator_log.read_text().splitlines() if "run failed" in line][0]
        assert "party 'passive-1' has not answered heartbeats for" in failed
        # resumed, the party finds the coordinator gone by its own heartbeats and stops, counting
        # dead_after_s from its resumption: the time it was stopped was its own silence, not the peer's
        os.kill(pids["passive-1"]["pid"], signal.SIGCONT)
        resumed = time.time()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0 and "passive-1" in err
        gave_up = [
            line for line in Path(pids["passive-1"]["log"]).read_text().splitlines() if "unreachable" in line
        ]
        assert gave_up, "the resumed party did not stop on its heartbeats"
        logged = (
            time.mktime(time.strptime(gave_up[0][:19], "%Y-%m-%d %H:%M:%S")) + int(gave_up[0][20:23]) / 1000
        )
        assert logged - resumed >= DEAD_AFTER_S - 0.1, f"gave up {logged - resumed:.1f} s after resuming"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed" and "passive-1" in summary["error"]
    finally:
        _stop_all(proc, pids)


def test_health_checks_pass_no_mod():
    """Heartbeats reach a server with a mod chain (trace tap, attacks) without the mods seeing them."""
    from vflnet.config import TransportConfig
    from vflnet.interceptors.bridge import GrpcBridge
    from vflnet.interceptors.chain import Chain
    from vflnet.roles.heartbeat import health_check

    seen: list[str] = []
    bridge = GrpcBridge(TransportConfig())
    server = bridge.make_server("coordinator", Chain([lambda event: seen.append(event.method)]))
    address = bridge.bind(server, "coordinator", "127.0.0.1:0")
    server.start()
    try:
        health_check(bridge.open_channel(address, "active", Chain(), "coordinator"))(10.0)
    finally:
        server.stop(0)
    assert seen == []
