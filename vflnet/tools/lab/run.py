"""`vflnet lab run`: each role in its own namespace, watched until the coordinator finishes.

Each process is ``ip netns exec NS <this python> -m vflnet party ...``. ``ip netns exec`` execs in
place, so the launcher's child is the party itself and gets SIGTERM if the launcher dies
(PR_SET_PDEATHSIG). Every namespace shares this machine's filesystem, so the run directory, the
logs and the proxy trace are all written under the lab directory.

``--fault`` changes a host's link or impairment at a step of the run (:mod:`.faults`);
``--resume RUN_DIR`` restarts a lab run's every process with ``--resume``, from its newest valid
checkpoint, as ``vflnet run --resume`` does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from vflnet.interceptors.trace import trace_path
from vflnet.roles.checkpoints import newest_valid
from vflnet.roles.run_lock import role_lock
from vflnet.runner.local import LAST_RUNS_FILES, _resumable_from_a_valid_checkpoint, stop_processes
from vflnet.runner.parent_death import child_env
from vflnet.runner.report import print_summary
from vflnet.tools.lab.faults import Fault, FaultSchedule, parse_fault
from vflnet.tools.lab.netlab import (
    Host,
    Lab,
    LabError,
    down,
    in_netns,
    is_up,
    lab_config,
    lab_processes,
    running_lab,
    up,
    write_yaml,
)
from vflnet.validation import load_config
from vflnet.wire import tls as tls_files

START_TIMEOUT_S = 60.0  # the proxy must be listening by then
EXIT_GRACE_S = 30.0  # parties exit on their own after the coordinator's Shutdown
PROXY_MAIN = "import sys; from vflnet.roles.proxy import main; sys.exit(main(sys.argv[1:]))"


class LabRunFailure(RuntimeError):
    pass


@dataclass
class Proc:
    host: Host
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def describe_exit(self) -> str:
        rc = self.popen.returncode
        how = f"was killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with code {rc}"
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-6:]
        except OSError:
            tail = []
        return f"{self.host.role} {self.host.name!r} in {self.host.ns} {how}; log: {self.log_path}" + (
            "\n    " + "\n    ".join(tail) if tail else ""
        )


@dataclass
class LabRunResult:
    rc: int
    run_dir: Path


def _listening(ns: str, port: int) -> bool:
    """A TCP socket in LISTEN state on ``port`` inside ``ns`` (read from the namespace's own
    /proc/net/tcp, so nothing connects to the listener just to find out)."""

    def check() -> bool:
        for line in Path("/proc/thread-self/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
        return False

    return in_netns(ns, check)


def make_certs(lab: Lab, out: Path, via: str | None) -> None:
    """A fresh CA and one certificate per party, naming its lab address. The party reached through
    the proxy also names the proxy's address, the address its peers dial, so an honest relay passes
    the hostname check and only what it does to the bytes decides the outcome."""
    tls_files.make_ca(out)
    proxy = lab.proxy
    for h in lab.hosts:
        if h.role == "proxy":
            continue  # the man in the middle gets no certificate from the run's CA
        hosts = [h.address] + ([proxy.address] if proxy is not None and h.name == via else [])
        tls_files.issue_party_cert(out, h.name, h.role, hosts)


@dataclass(frozen=True)
class RunOptions:
    """How a lab run was started, kept in its run directory (``lab-run.json``) for ``--resume``."""

    tls: bool = False
    via: str | None = None
    proxy_mode: str = "grpc"
    tamper: bool = False
    proxy_args: tuple[str, ...] = ()


class LabRun:
    def __init__(
        self, lab: Lab, run_dir: Path, config_path: Path, timeout_s: float, resume: bool = False
    ) -> None:
        self.lab, self.run_dir, self.config_path, self.timeout_s = lab, run_dir, config_path, timeout_s
        self.resume = resume
        self.dead_after_s = load_config(config_path).transport.dead_after_s
        self.procs: dict[str, Proc] = {}

    def _spawn(self, host: Host, args: list[str]) -> Proc:
        log_path = self.run_dir / "logs" / f"{host.name}.log"
        log_file = log_path.open("ab")
        env = child_env(dict(os.environ, PYTHONUNBUFFERED="1"))
        popen = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, sys.executable, *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        proc = Proc(host, popen, log_path, log_file)
        self.procs[host.name] = proc
        print(
            f"  {host.role:11s} {host.name:12s} {host.ns:20s} {host.endpoint:20s} pid {popen.pid}",
            file=sys.stderr,
        )
        return proc

    def _wait_until(self, proc: Proc, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if proc.popen.poll() is not None:
                raise LabRunFailure(proc.describe_exit())
            if time.monotonic() > deadline:
                raise LabRunFailure(f"{what} within {START_TIMEOUT_S:.0f} s; see {proc.log_path}")
            time.sleep(0.1)

    def start(self, via: str | None, proxy_mode: str, tamper: bool, proxy_args: Sequence[str]) -> None:
        lab = self.lab
        party = ["-m", "vflnet", "party", "--config", str(self.config_path), "--run-dir", str(self.run_dir)]
        party += ["--resume"] if self.resume else []
        if via is not None:
            proxy = lab.proxy
            assert proxy is not None  # lab_config has refused a via without a proxy host
            program = ["-m", "vflnet.tools.lab.mitm"] if tamper else ["-c", PROXY_MAIN]
            args = [*program, "--listen", proxy.endpoint, "--upstream", lab.host(via).endpoint]
            args += ["--mode", proxy_mode]
            # The adversary's own view of the run: same job and run id, but no certificates, and
            # plaintext allowed (it only ever speaks plaintext gRPC, and is refused under TLS).
            args += ["--config", str(self.run_dir / "proxy-config.yaml")]
            if proxy_mode == "grpc":  # a TCP relay decodes nothing, so it keeps no trace
                args += ["--trace", str(trace_path(self.run_dir, proxy.name))]
            proc = self._spawn(proxy, args + list(proxy_args))
            self._wait_until(proc, lambda: _listening(proxy.ns, proxy.port), "the proxy was not listening")
        coord = next(h for h in lab.hosts if h.role == "coordinator")
        # All at once, as on separate machines: a party's Join waits for the coordinator to listen.
        for h in [coord, *(h for h in lab.hosts if h.role in ("active", "passive"))]:
            args = [*party, "--role", h.role, "--name", h.name, "--listen", h.endpoint]
            self._spawn(h, args if h is coord else [*args, "--coordinator", coord.endpoint])

    def wait(self) -> None:
        """Until the coordinator exits; fails fast when any other process exits first or time runs out."""
        coord = next(p for p in self.procs.values() if p.host.role == "coordinator")
        deadline = time.monotonic() + self.timeout_s
        while coord.popen.poll() is None:
            for p in self.procs.values():
                if (
                    p is not coord
                    and p.popen.poll() is not None
                    and (p.host.role == "proxy" or p.popen.returncode != 0)
                ):
                    # the coordinator fails the run itself (the step's call fails, or heartbeats
                    # stop): let it write summary.json, naming the party, before tearing down
                    try:
                        coord.popen.wait(timeout=self.dead_after_s + 5)
                    except subprocess.TimeoutExpired:
                        pass
                    raise LabRunFailure(p.describe_exit())
            if time.monotonic() > deadline:
                raise LabRunFailure(f"the run did not finish within {self.timeout_s:.0f} s (--timeout)")
            time.sleep(0.1)
        if coord.popen.returncode != 0:  # a party it could not reach to shut down would only time out
            raise LabRunFailure(coord.describe_exit())
        parties = [p for p in self.procs.values() if p.host.role in ("active", "passive")]
        deadline = time.monotonic() + EXIT_GRACE_S
        for p in parties:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        bad = [p for p in parties if p.popen.returncode != 0]
        if bad:
            raise LabRunFailure(
                "; ".join(
                    p.describe_exit()
                    if p.popen.returncode is not None
                    else f"{p.host.name} did not exit within {EXIT_GRACE_S:.0f} s"
                    for p in bad
                )
            )

    def teardown(self) -> None:
        stop_processes([p.popen for p in self.procs.values()])
        for p in self.procs.values():
            p.log_file.close()


def new_run_dir(lab: Lab) -> tuple[str, Path]:
    run_id = f"{Path(lab.source_config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir, n = lab.dir / "runs" / run_id, 1
    while run_dir.exists():
        n += 1
        run_dir = lab.dir / "runs" / f"{run_id}-{n}"
    (run_dir / "logs").mkdir(parents=True)
    return run_dir.name, run_dir


def run_lab(
    lab: Lab,
    *,
    tls: bool = False,
    via: str | None = None,
    proxy_mode: str = "grpc",
    tamper: bool = False,
    proxy_args: Sequence[str] = (),
    timeout_s: float = 600.0,
    faults: Sequence[str] = (),
) -> LabRunResult:
    """One training run on the lab; the result's rc is 0 on success, 1 on failure, 130 on Ctrl-C."""
    schedule = [parse_fault(f, lab) for f in faults]
    _check_idle(lab, via)
    run_id, run_dir = new_run_dir(lab)
    options = RunOptions(tls, via, proxy_mode, tamper, tuple(proxy_args))
    certs = run_dir / "certs" if tls else None
    config = lab_config(lab, run_id, run_dir.parent, certs, via)
    if certs is not None:
        make_certs(lab, certs, via)
    config_path = run_dir / "config.yaml"
    write_yaml(config_path, config, f"Generated by `vflnet lab run` for lab {lab.prefix!r} ({lab.lab_dir}).")
    if via is not None:
        proxy_view = lab_config(lab, run_id, run_dir.parent, None, via)
        write_yaml(
            run_dir / "proxy-config.yaml", proxy_view, "What the proxy knows of the run: plaintext only."
        )
    shutil.copy(lab.dir / "lab.json", run_dir / "lab.json")
    (run_dir / "lab-run.json").write_text(json.dumps(asdict(options), indent=2) + "\n")
    return _execute(lab, run_dir, options, schedule, timeout_s, resume=False)


def resume_lab(run_dir: Path, *, timeout_s: float = 600.0, faults: Sequence[str] = ()) -> LabRunResult:
    """`vflnet lab run --resume RUN_DIR`: the lab run in RUN_DIR, every process restarted with
    --resume (the coordinator continues from the newest valid checkpoint), on its lab: the one up
    under its prefix, or one brought up and down again with the settings the run recorded."""
    run_dir = run_dir.resolve()
    for name in ("config.yaml", "lab.json", "lab-run.json"):
        if not (run_dir / name).is_file():
            raise LabError(f"--resume {run_dir}: it has no {name}: not a run directory of `vflnet lab run`")
    recorded = json.loads((run_dir / "lab.json").read_text())
    recorded["hosts"] = [Host(**h) for h in recorded["hosts"]]
    lab = Lab(**recorded)
    started = json.loads((run_dir / "lab-run.json").read_text())
    options = RunOptions(**{**started, "proxy_args": tuple(started["proxy_args"])})
    brought_up = not is_up(lab)
    if brought_up:
        lab = up(
            lab.source_config,
            prefix=lab.prefix,
            lab_dir=lab.lab_dir,
            netem=lab.netem,
            proxy_host=lab.proxy is not None,
            emulator=lab.emulator if lab.emulator != "none" else "auto",
            tcp_cc=lab.tcp_cc,
        )
    else:
        lab = running_lab(lab.prefix)
    try:
        cfg = load_config(run_dir / "config.yaml")
        for party in cfg.parties:
            if lab.host(party.name).endpoint != party.address:
                raise LabError(
                    f"--resume {run_dir}: lab {lab.prefix!r} has {party.name} at {lab.host(party.name).endpoint}, "
                    f"the run at {party.address}"
                )
        schedule = [parse_fault(f, lab) for f in faults]
        _check_idle(lab, options.via)
        with role_lock(run_dir, "launcher"):
            for stale in LAST_RUNS_FILES:
                (run_dir / stale).unlink(missing_ok=True)
            if not _resumable_from_a_valid_checkpoint(cfg, run_dir):
                return LabRunResult(1, run_dir)
            manifest, _ = newest_valid(run_dir, cfg.run.id, cfg.coordinator.name)
            where = f"step {manifest.step}" if manifest is not None else "its first step (no checkpoint yet)"
            print(f"lab run {run_dir.name}: resuming from {where}", file=sys.stderr)
            return _execute(lab, run_dir, options, schedule, timeout_s, resume=True)
    finally:
        if brought_up:
            down(lab.prefix)


def _check_idle(lab: Lab, via: str | None) -> None:
    stray = lab_processes(lab)
    if stray:
        raise LabError(f"processes are still running in the lab: {stray}; stop them with `vflnet lab down`")
    if via is not None and importlib.util.find_spec("vflnet.roles.proxy") is None:
        raise LabError("--via-proxy needs vflnet.roles.proxy, which this installation does not have")


def _execute(
    lab: Lab,
    run_dir: Path,
    options: RunOptions,
    schedule: list[Fault],
    timeout_s: float,
    resume: bool,
) -> LabRunResult:
    run_id, via = run_dir.name, options.via
    impair = f"{lab.netem} ({lab.emulator})" if lab.netem else "none"
    print(
        f"lab run {run_id}: transport {'mutual TLS' if options.tls else 'plaintext'}, impairment {impair}"
        + (
            f", {via} reached via the {'tampering ' if options.tamper else ''}{options.proxy_mode} proxy"
            if via
            else ""
        )
        + "".join(f", fault {f.text!r}" for f in schedule)
        + f"; run directory {run_dir}",
        file=sys.stderr,
    )
    run = LabRun(lab, run_dir, run_dir / "config.yaml", timeout_s, resume)
    faults = FaultSchedule(lab, schedule, run_dir)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        try:
            run.start(via, options.proxy_mode, options.tamper, options.proxy_args)
            faults.start()
            run.wait()
        finally:
            problems = faults.stop()
        if problems:  # a fault that did not happen leaves a run that did not test what it was for
            raise LabRunFailure("; ".join(problems))
        print_summary(run_dir)
        return LabRunResult(0, run_dir)
    except LabRunFailure as exc:
        print(f"\nlab run {run_id} FAILED: {exc}", file=sys.stderr)
        if (run_dir / "summary.json").exists():
            print_summary(run_dir, sys.stderr)
        return LabRunResult(1, run_dir)
    except KeyboardInterrupt:
        print(f"\nlab run {run_id} interrupted; stopping all processes", file=sys.stderr)
        return LabRunResult(130, run_dir)
    finally:
        run.teardown()
        signal.signal(signal.SIGTERM, previous)
        print(f"logs: {run_dir / 'logs'}", file=sys.stderr)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
