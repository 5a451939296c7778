"""`vflnet run`: a local cluster of real processes on loopback.

The coordinator starts first on a free port and writes its address to the run directory; the
parties start next, bind their own free ports and join it. The launcher shows progress from
metrics.jsonl, and if any process fails (or on Ctrl-C) tears every process down: children also get
SIGTERM from the kernel if the launcher itself dies (PR_SET_PDEATHSIG), so none is orphaned.

Role processes start warm by default: forked from a fork server that has torch and vflnet imported
(vflnet/runner/warm.py), started once per launcher (or offered by ``vflnet sweep`` to all its runs);
``start="cold"`` (``vflnet run --start cold``, ``VFLNET_START=cold``) starts each as
``python -m vflnet party ...``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from vflnet.config import Config, ConfigError, dump
from vflnet.progress import bar as progress_bar
from vflnet.progress import quiet
from vflnet.roles.run_lock import role_lock
from vflnet.runner.interrupt import INTERRUPTED_EXIT, SIGNALS, raise_interrupted, signal_of
from vflnet.runner.report import print_summary
from vflnet.runner.scoring import score_run
from vflnet.runner.warm import (
    ForkServer,
    ForkServerError,
    Process,
    fork_server,
    role_env,
    shared_server,
    start_vflnet,
)
from vflnet.threat.interception import TAP_BLOCKS_ENV, bench_tap_blocks
from vflnet.validation import load_config

START_MODES = ("warm", "cold")


@dataclass
class Child:
    name: str
    role: str
    proc: Process
    log_path: Path
    log_file: IO[bytes]
    log_start: int  # where this process's part of the log begins (a resumed run appends to it)


class LocalCluster:
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        config_path: Path,
        deadline: Deadline | None = None,
        resume: bool = False,
        server: ForkServer | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.config_path = cfg, run_dir, config_path
        self.resume = resume
        self.server = server  # None: cold start
        self.children: dict[str, Child] = {}
        self.deadline = deadline or Deadline(None)

    def _spawn(self, name: str, role: str, extra: list[str]) -> Child:
        cmd = [
            "party",
            "--role",
            role,
            "--config",
            str(self.config_path),
            "--name",
            name,
            "--run-dir",
            str(self.run_dir),
            *(["--resume"] if self.resume else []),
        ]
        return self._spawn_command(name, role, [*cmd, *extra])

    def _spawn_command(self, name: str, role: str, args: list[str]) -> Child:
        log_path = self.run_dir / "logs" / f"{name}.log"
        log_file = log_path.open("ab")
        log_start = log_file.tell()
        env = role_env(self.cfg.runtime.torch_threads)
        try:
            proc = start_vflnet(args, env, log_file, self.server, self.cfg.transport.join_timeout_s)
        except ForkServerError as exc:
            log_file.close()
            raise ClusterFailure(f"{name}: {exc}") from exc
        child = Child(name, role, proc, log_path, log_file, log_start)
        self.children[name] = child
        return child

    def start(self) -> None:
        self.deadline.check()  # the command's start-up may have used it all: then no process starts
        coord = self.cfg.coordinator
        addr_file = self.run_dir / "coordinator.addr"
        # an earlier run in this folder left its coordinator's address: parties must not dial it
        addr_file.unlink(missing_ok=True)
        child = self._spawn(coord.name, "coordinator", ["--listen", "127.0.0.1:0"])
        limit = self.cfg.transport.join_timeout_s  # a loaded machine may take long to start a Python process
        deadline = time.monotonic() + limit
        while not addr_file.exists():
            self.deadline.check()
            if child.proc.poll() is not None:
                raise ClusterFailure(self._describe_exit(child))
            if time.monotonic() > deadline:
                raise ClusterFailure(
                    f"the coordinator did not start within transport.join_timeout_s ({limit:.0f} s); see {child.log_path}"
                )
            time.sleep(0.05)
        address = addr_file.read_text().strip()
        for party in self.cfg.parties:
            if party.role == "coordinator":
                continue
            if party.via == "proxy":
                # peers reach this party only through a proxy process in front of it
                own, front = free_port(), free_port()
                self._spawn_command(
                    f"proxy-{party.name}",
                    "proxy",
                    [
                        "proxy",
                        "--listen",
                        f"127.0.0.1:{front}",
                        "--upstream",
                        f"127.0.0.1:{own}",
                        "--name",
                        f"proxy-{party.name}",
                        "--run-id",
                        self.cfg.run.id,
                        "--config",
                        str(self.config_path),
                        "--trace",
                        str(self.run_dir / "traces" / f"proxy-{party.name}.trace"),
                    ],
                )
                where = ["--listen", f"127.0.0.1:{own}", "--advertise", f"127.0.0.1:{front}"]
            else:
                where = ["--listen", "127.0.0.1:0", "--advertise", "127.0.0.1:0"]
            self._spawn(party.name, party.role, ["--coordinator", address, *where])
        pids = {
            c.name: {"pid": c.proc.pid, "role": c.role, "log": str(c.log_path)}
            for c in self.children.values()
        }
        (self.run_dir / "processes.json").write_text(json.dumps(pids, indent=2))

    def _describe_exit(self, child: Child) -> str:
        rc = child.proc.returncode
        how = (
            f"was killed by signal {-rc} ({signal.Signals(-rc).name})"
            if rc is not None and rc < 0
            else f"exited with code {rc}"
        )
        cause = cause_in_log(child.log_path, child.log_start) if rc is not None and rc > 0 else None
        tail = _tail(child.log_path, 6)
        return (
            f"{child.role} party {child.name!r} (pid {child.proc.pid}) {how}"
            + (f": {cause}" if cause else "")
            + f"; log: {child.log_path}"
            + ("\n    " + "\n    ".join(tail) if tail else "")
        )

    def _party_cause(self, coordinator_failed: bool = False) -> Child | None:
        """The party whose end failed the run: one killed by a signal (this launcher sends none before
        its teardown) before one that exited with an error, which may only be a consequence. Once the
        coordinator has failed, a party that stopped because it lost the coordinator is what followed;
        one that exited with an error of its own (refused at its Join, failed to start) is the cause."""
        from vflnet.roles.party import LOST_COORDINATOR

        ended = [
            c
            for c in self.children.values()
            if c.name != self.cfg.coordinator.name
            and c.proc.poll() not in (None, 0)
            # after the coordinator's end this launcher stopped the proxies itself
            and not (coordinator_failed and (c.proc.returncode == LOST_COORDINATOR or c.role == "proxy"))
        ]
        return min(ended, key=lambda c: c.proc.returncode >= 0, default=None)

    def wait(self, progress: bool) -> int:
        """Return the coordinator's exit code, or raise ClusterFailure if another process fails first."""
        coord = self.children[self.cfg.coordinator.name]
        bar = _Progress(self.run_dir, enabled=progress)
        try:
            while coord.proc.poll() is None:
                self.deadline.check()
                cause = self._party_cause()
                if cause is not None:
                    # once the schedule runs (plan.json) the coordinator fails the run itself (the
                    # step's call fails, or heartbeats stop): let it write summary.json before tearing
                    # down; before that it only waits for the roster, which can no longer complete
                    if (self.run_dir / "plan.json").exists():
                        try:
                            coord.proc.wait(timeout=self.cfg.transport.dead_after_s + 5)
                        except subprocess.TimeoutExpired:
                            pass
                    raise ClusterFailure(self._describe_exit(cause), party=cause.name)
                bar.update()
                time.sleep(0.1)
            bar.update()
        finally:
            bar.close()
        if coord.proc.returncode < 0:  # killed: it told no party to stop, so they are torn down now
            raise ClusterFailure(self._describe_exit(coord))
        for child in self.children.values():
            if child.role == "proxy":  # proxies serve until told to stop
                child.proc.terminate()
        # parties exit on their own after the Shutdown RPC; a coordinator that failed has sent it to
        # every party still alive before exiting, so those left (a party stopped or hung) are not waited out
        failed = (coord.proc.returncode or 0) > 0
        deadline = time.monotonic() + (10 if failed else 30)
        for child in self.children.values():
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        rc = coord.proc.returncode
        if rc != 0:
            cause = self._party_cause(coordinator_failed=True)
            if cause is not None:
                raise ClusterFailure(self._describe_exit(cause), party=cause.name)
            raise ClusterFailure(self._describe_exit(coord))
        bad = [c for c in self.children.values() if c.proc.returncode not in (0,)]
        if bad:
            raise ClusterFailure(
                "; ".join(
                    self._describe_exit(c) if c.proc.returncode is not None else f"{c.name} did not exit"
                    for c in bad
                )
            )
        return 0

    def teardown(self, sig: int = signal.SIGTERM) -> None:
        stop_processes([c.proc for c in self.children.values()], sig=sig)
        for c in self.children.values():
            c.log_file.close()


def stop_processes(procs: Sequence[Process], grace_s: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """``sig`` (SIGTERM, or the signal that stopped the caller) to every process still running, SIGKILL
    to those still alive ``grace_s`` later."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(sig)
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class ClusterFailure(RuntimeError):
    """The run failed; ``party``: the party (not the coordinator) whose death or error was its first cause."""

    def __init__(self, message: str, party: str | None = None) -> None:
        super().__init__(message)
        self.party = party


class RunTimeout(Exception):
    """The run went over ``vflnet run --timeout``."""


# the exit code of a run stopped by --timeout: timeout(1)'s, so scripts and CI read it the same way
TIMEOUT_EXIT = 124


class Deadline:
    """``vflnet run --timeout``: the whole run's limit in seconds from ``since`` (a time.monotonic();
    default now; the command gives its process's start, `process_started`); None: no limit."""

    def __init__(self, seconds: float | None, since: float | None = None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else (time.monotonic() if since is None else since) + seconds

    def check(self) -> None:
        if self.at is not None and time.monotonic() > self.at:
            raise RunTimeout


def process_started() -> float:
    """When this process started (a fork server's child: when it was forked), on time.monotonic()'s
    clock: its start time in /proc/self/stat, in clock ticks since boot."""
    with open("/proc/self/stat") as stat:  # the name (field 2) may hold spaces: count after its ")"
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age


def free_port() -> int:
    """A currently free loopback port (for processes whose port others must know in advance)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Progress:
    """A tqdm bar fed from the coordinator's metrics.jsonl (the launcher has no other window into the run)."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.plan = run_dir / "plan.json"
        self.enabled = enabled and not quiet()
        self.bar: Any = None
        self.offset = 0

    def update(self) -> None:
        if not self.enabled or not self.plan.exists() or not self.path.exists():
            return
        if self.bar is None:
            total = json.loads(self.plan.read_text())["total_steps"]
            self.bar = progress_bar("training", total, unit="step")
        with self.path.open() as fh:
            fh.seek(self.offset)
            for line in iter(fh.readline, ""):
                if not line.endswith("\n"):
                    break  # partial line: read it next time
                self.offset += len(line)
                rec = json.loads(line)
                if rec.get("kind") == "step":
                    self.bar.update(1)
                    self.bar.set_postfix(epoch=rec["epoch"], loss=f"{rec['loss']:.3f}")
                elif rec.get("kind") == "epoch" and "test_accuracy" in rec:
                    self.bar.write(
                        f"epoch {rec['epoch']}: train loss {rec['train_loss']:.4f}, test accuracy {rec['test_accuracy']:.4f}"
                    )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# a role's log record (vflnet.roles.common.setup_logging): time, process name, level, logger: message
_LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ \S+ (?P<level>[A-Z]+) \S+: (?P<message>.*)$")


def cause_in_log(path: Path, start: int = 0) -> str | None:
    """Why a role process failed, from its log from byte ``start`` on: the exception of a traceback
    that ended it, else its last ERROR record's message; None if the log says neither."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            after = [line for line in lines[i + 1 :] if line and not line[0].isspace()]
            if after:
                return after[0]
        record = _LOG_RECORD.match(lines[i])
        if record is not None and record["level"] in ("ERROR", "CRITICAL"):
            return record["message"]
        if lines[i].startswith(("config error: ", "error: ")):  # a user error (vflnet.cli) ended it
            return lines[i]
    return None


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").strip().splitlines()[-n:]
    except OSError:
        return []


def choose_run_dir(cfg: Config, config_path: Path, run_dir: Path | None) -> Path:
    """Give the run an id and, unless one is given, a fresh directory."""
    if not cfg.run.id:
        cfg.run.id = f"{config_path.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    Path(cfg.run.dir).mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        # mkdir without exist_ok is the claim: of two launchers started in the same second, only one
        # creates a name, the other moves on to the next suffix
        run_dir = Path(cfg.run.dir) / (cfg.run.id if n == 1 else f"{cfg.run.id}-{n}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            n += 1
            continue
        return run_dir


def run_local(
    config_path: str | Path,
    *,
    run_dir: Path | None = None,
    progress: bool = True,
    timeout_s: float | None = None,
    overrides: Sequence[str] = (),
    start: str = "warm",
    since: float | None = None,
) -> int:
    """Run ``config_path``'s cluster, with the command line's ``KEY=VALUE`` ``overrides`` (the run
    directory's config.yaml holds the result); ``timeout_s`` (``--timeout``) limits the whole run: past
    it every process is stopped and the exit code is 124. ``start``: how role processes start (warm:
    forked from a fork server; cold: each a new interpreter). ``since``: when the timeout starts (a
    time.monotonic(); default now; `vflnet run` gives its process's start)."""
    deadline = Deadline(timeout_s, since)
    config_path = Path(config_path)
    cfg = load_config(config_path, overrides=overrides, launcher="run")
    run_dir = choose_run_dir(cfg, config_path, run_dir)
    with role_lock(run_dir, "launcher"):  # before anything is written: the directory may be another run's
        (run_dir / "logs").mkdir(exist_ok=True)
        resolved = run_dir / "config.yaml"
        dump(cfg, resolved)
        try:
            return _run_resuming(cfg, run_dir, resolved, progress, deadline, start)
        except RunTimeout:  # every process is stopped by now (the teardowns below)
            print(f"\nrun {cfg.run.id} exceeded --timeout {deadline.seconds:g} s", file=sys.stderr)
            return TIMEOUT_EXIT


def resume_local(
    run_dir: Path,
    *,
    progress: bool = True,
    timeout_s: float | None = None,
    start: str = "warm",
    since: float | None = None,
) -> int:
    """`vflnet run --resume RUN_DIR`: the same run (its resolved config.yaml) restarted in every
    process with --resume; the coordinator continues from the newest valid checkpoint."""
    resolved = run_dir / "config.yaml"
    if not resolved.is_file():
        print(f"vflnet run --resume: {run_dir} has no config.yaml: not a run directory", file=sys.stderr)
        return 2
    cfg = load_config(resolved)
    if cfg.transport.bridge == "loopback":
        print("vflnet run --resume: a loopback run cannot resume; run it again", file=sys.stderr)
        return 2
    deadline = Deadline(timeout_s, since)
    with role_lock(run_dir, "launcher"):
        try:
            return _run_resuming(cfg, run_dir, resolved, progress, deadline, start, resume=True)
        except RunTimeout:
            print(f"\nrun {cfg.run.id} exceeded --timeout {deadline.seconds:g} s", file=sys.stderr)
            return TIMEOUT_EXIT


# what a resumed run writes afresh: left over from the last run they would mislead the launcher
LAST_RUNS_FILES = ("coordinator.addr", "plan.json", "summary.json", "processes.json")


def _run_resuming(
    cfg: Config,
    run_dir: Path,
    resolved: Path,
    progress: bool,
    deadline: Deadline,
    start: str,
    resume: bool = False,
) -> int:
    """The run, resumed by this launcher up to ``run.auto_resume`` times after it failed (a process
    died, a step failed): each time every process restarts with --resume from the newest checkpoint."""
    from vflnet.roles.checkpoints import latest_manifest
    from vflnet.sdk.contract import PROTOCOLS

    resumable = cfg.transport.bridge != "loopback" and PROTOCOLS.get(cfg.protocol.kind).resumable
    with _fork_server(cfg, start) as server:  # one for every attempt
        attempt = 0
        while True:
            if resume:
                for stale in LAST_RUNS_FILES:
                    (run_dir / stale).unlink(missing_ok=True)
                if not _resumable_from_a_valid_checkpoint(cfg, run_dir):
                    return 1
            rc = _run(cfg, run_dir, resolved, progress, deadline, resume, server)
            if rc != 1 or not resumable or attempt >= cfg.run.auto_resume:
                return rc
            attempt += 1
            manifest = latest_manifest(run_dir, cfg.run.id, cfg.coordinator.name)
            print(
                f"run {cfg.run.id}: resuming by itself from step {manifest.step if manifest else 0} "
                f"(run.auto_resume: attempt {attempt} of {cfg.run.auto_resume})",
                file=sys.stderr,
            )
            resume = True


@contextmanager
def _fork_server(cfg: Config, start: str) -> Iterator[ForkServer | None]:
    """The fork server a run's role processes start from: the one a sweep offers when it is for the
    run's torch threads, else one of its own; None for a cold start and for the loopback bridge (no
    role processes)."""
    if start not in START_MODES:
        raise ValueError(f"start must be one of {START_MODES}, not {start!r}")
    offered = shared_server()
    if start == "cold" or cfg.transport.bridge == "loopback":
        yield None
    elif offered is not None and offered.torch_threads == cfg.runtime.torch_threads:
        yield offered
    else:
        with fork_server(cfg.runtime.torch_threads) as server:
            yield server


def _resumable_from_a_valid_checkpoint(cfg: Config, run_dir: Path) -> bool:
    """Check every process's checkpoint file before any process starts (the run directory holds them
    all): say which checkpoints are skipped and why, and from which step the run resumes; when
    checkpoints exist and none is complete and valid, fail at once naming each step and file."""
    from vflnet.roles.checkpoints import drop_after, newest_valid, none_valid

    manifest, skipped = newest_valid(run_dir, cfg.run.id, cfg.coordinator.name, every_file=True)
    for why in skipped:
        print(f"run {cfg.run.id}: skipping checkpoint {why}", file=sys.stderr)
    if manifest is None and skipped:
        error = none_valid(skipped)
        print(f"run {cfg.run.id} FAILED: {error}", file=sys.stderr)
        _summary_if_missing(cfg, run_dir, "failed", error)
        return False
    if manifest is None:
        print(f"run {cfg.run.id}: no checkpoint yet: resuming from the first step", file=sys.stderr)
    elif skipped:
        # the coordinator, which checks only the files it must hold (compose), chooses the same step:
        # the newer ones go, as they would once it resumed
        drop_after(run_dir, manifest.step)
        print(
            f"run {cfg.run.id}: resuming from step {manifest.step}, the newest valid checkpoint",
            file=sys.stderr,
        )
    else:
        print(f"run {cfg.run.id}: resuming from step {manifest.step}", file=sys.stderr)
    return True


def _run(
    cfg: Config,
    run_dir: Path,
    resolved: Path,
    progress: bool,
    deadline: Deadline,
    resume: bool,
    server: ForkServer | None,
) -> int:
    blocks = bench_tap_blocks()
    if blocks and not cfg.trace.parties:  # it would time nothing
        raise ConfigError(
            "", TAP_BLOCKS_ENV, f"times the trace tap, and run {cfg.run.id} traces no party; unset it"
        )
    if blocks:  # never silent, whatever the log level: its traces are partial
        print(
            f"run {cfg.run.id}: {TAP_BLOCKS_ENV}={blocks}: its traces hold the steps of even blocks of "
            f"{blocks} only (a benchmark's A/B of the tap)",
            file=sys.stderr,
        )
    if cfg.transport.bridge == "loopback":
        return _run_in_process(cfg, run_dir, progress, deadline)
    print(f"run {cfg.run.id}: {len(cfg.parties)} processes, run directory {run_dir}", file=sys.stderr)
    cluster = LocalCluster(cfg, run_dir, resolved, deadline, resume, server)
    # Ctrl-C and SIGTERM stop the run; set explicitly: a process started with SIGINT ignored (a
    # nohup, a CI runner, a pytest-xdist worker) would otherwise inherit the ignoring
    previous = {sig: signal.signal(sig, raise_interrupted) for sig in SIGNALS}
    stop_with = signal.SIGTERM  # the signal that stopped the launcher, passed on (the run records it)
    ended: tuple[str, str] | None = None  # (status, error) if the run did not complete
    party_cause = False  # the error is a party's death or error, which summary.json must name first
    try:
        cluster.start()
        cluster.wait(progress)
        score_run(cfg, run_dir)
        print_summary(run_dir)
        return 0
    except ClusterFailure as exc:
        print(f"\nrun {cfg.run.id} FAILED: {exc}", file=sys.stderr)
        ended = ("failed", str(exc))
        party_cause = exc.party is not None
        return 1
    except KeyboardInterrupt as exc:
        stop_with = signal_of(exc)
        print(f"\nrun {cfg.run.id} interrupted; stopping all processes", file=sys.stderr)
        ended = ("interrupted", f"vflnet run was stopped by signal {stop_with.name}")
        return INTERRUPTED_EXIT
    finally:
        cluster.teardown(stop_with)  # a coordinator still running writes summary.json on that signal
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ended is not None:
            _summary_if_missing(cfg, run_dir, *ended)
            if party_cause:  # after the teardown: the coordinator writes summary.json until it exits
                _name_the_cause(cfg, run_dir, ended[1])


def _name_the_cause(cfg: Config, run_dir: Path, cause: str) -> None:
    """A party's death failed the run: summary.json's error is that, first; what the coordinator saw
    next (often another party failing to reach the dead one) is kept as ``coordinator_error``."""
    path = run_dir / "summary.json"
    if not path.exists():  # not even the launcher could write it (_summary_if_missing said so)
        return
    summary = json.loads(path.read_text())
    if summary.get("error") != cause:
        summary["coordinator_error"] = summary.get("error")
        summary.update(status="failed", error=cause)
        _write_summary(cfg, run_dir, summary)


def _summary_if_missing(cfg: Config, run_dir: Path, status: str, error: str) -> None:
    """The coordinator writes summary.json; if it died first, the launcher says what happened, and
    where `vflnet run --resume` would continue."""
    path = run_dir / "summary.json"
    if path.exists():
        return
    from vflnet.roles.checkpoints import latest_manifest

    manifest = latest_manifest(run_dir, cfg.run.id, cfg.coordinator.name)
    summary = {
        "run_id": cfg.run.id,
        "status": status,
        "error": error,
        "resumable_after_step": manifest.step if manifest else 0,
        "resume": f"vflnet run --resume {run_dir}",
    }
    _write_summary(cfg, run_dir, summary)


def _write_summary(cfg: Config, run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json by the launcher; if the disk refuses it too, the console says why and where the
    run's state is instead."""
    from vflnet.durable import WriteFailed, write_durable
    from vflnet.roles.checkpoints import latest_manifest

    try:
        write_durable(run_dir / "summary.json", json.dumps(summary, indent=2).encode(), "the summary")
    except WriteFailed as exc:
        manifest = latest_manifest(run_dir, cfg.run.id, cfg.coordinator.name)
        print(
            f"run {cfg.run.id}: no summary.json: {exc}. The run's state is in {run_dir} "
            f"(its logs in {run_dir / 'logs'}); "
            + (
                f"its newest checkpoint is step {manifest.step}: `vflnet run --resume {run_dir}` continues "
                "from it once the disk has room"
                if manifest
                else f"it has no checkpoint: `vflnet run --resume {run_dir}` starts it again"
            ),
            file=sys.stderr,
        )


def _run_in_process(cfg: Config, run_dir: Path, progress: bool, deadline: Deadline) -> int:
    from vflnet.runner.loopback import LoopbackFailure, run_loopback

    print(
        f"run {cfg.run.id}: {len(cfg.parties)} roles in this process (loopback bridge), run directory {run_dir}",
        file=sys.stderr,
    )
    bar = _Progress(run_dir, enabled=progress)

    def tick() -> None:
        bar.update()
        deadline.check()  # past it the roles' threads (daemons) are left to end with the process

    try:
        run_loopback(cfg, run_dir, on_tick=tick)
    except LoopbackFailure as exc:
        print(f"\nrun {cfg.run.id} FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.update()
        bar.close()
    score_run(cfg, run_dir)
    print_summary(run_dir)
    return 0
