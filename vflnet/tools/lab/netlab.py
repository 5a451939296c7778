"""A multi-host network on one machine: one network namespace per party, joined by a switch.

Every party of a config's roster (and optionally a proxy host) gets its own namespace with its
own address on ``10.213.0.0/24``. Its ``eth0`` is one end of a veth pair; the other end sits in a
dedicated switch namespace, on a bridge. Nothing is added to the host's own namespace, so the
host's interfaces and routes stay as they are, and a lab process can reach only the other lab
hosts (no namespace has a route off the subnet). With ``--netem`` every host's egress is impaired
by ``tc netem`` where the kernel has it. Otherwise, or with ``--emulator userspace``, the bridge is
replaced by the userspace hub in :mod:`vflnet.tools.lab.switch`, which applies delay, jitter, loss
and rate per host, and changes them, or takes a host's link down and up, while a run goes on
(:func:`impair`).

What was created is recorded before it is created, in ``/run/vflnet-lab/<prefix>.json``. That way
:func:`down` can also clean up after a lab that failed halfway through ``up``.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from vflnet.validation import load_config

SUBNET = ipaddress.ip_network("10.213.0.0/24")  # private, and unlikely to collide with anything real
FIRST_HOST = 10  # hosts get .10, .11, ... in roster order; the proxy host comes last
COORDINATOR_PORT = 50051  # the other parties get 50052, 50053, ... as in configs/compose.yaml
PROXY_PORT = 50060
REGISTRY = Path("/run/vflnet-lab")
PROXY_HOST = "proxy"
CLONE_NEWNET = 0x40000000
_PREFIX = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
T = TypeVar("T")


class LabError(RuntimeError):
    pass


@dataclass
class Host:
    name: str  # roster name, or "proxy"
    role: str  # coordinator / active / passive / proxy
    ns: str
    address: str
    port: int
    switch_port: str  # the veth end in the switch namespace

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass
class Lab:
    prefix: str
    lab_dir: str
    source_config: str
    switch_ns: str
    hosts: list[Host]
    emulator: str = "none"  # none / netem / userspace
    netem: str = ""
    switch_pid: int = 0
    tcp_cc: str = ""  # the hosts' TCP congestion control ("": the machine's default, inherited)
    control: str = ""  # the userspace hub's control socket ("": no hub)
    created: float = field(default_factory=time.time)

    @property
    def dir(self) -> Path:
        return Path(self.lab_dir)

    @property
    def config_path(self) -> Path:
        return self.dir / "config.yaml"

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError(
            f"lab {self.prefix!r} has no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})"
        )

    @property
    def proxy(self) -> Host | None:
        return next((h for h in self.hosts if h.role == "proxy"), None)

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns, *(h.ns for h in self.hosts)]

    def save(self) -> None:
        (self.dir / "lab.json").write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def open(cls, lab_dir: str | Path) -> Lab:
        path = Path(lab_dir) / "lab.json"
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise LabError(
                f"{path}: not a lab directory ({exc.strerror}); make one with `vflnet lab up CONFIG`"
            ) from exc
        data["hosts"] = [Host(**h) for h in data["hosts"]]
        return cls(**data)


# ------------------------------------------------------------------------------------ host tools
def unavailable_reason() -> str | None:
    """Why this machine cannot run a lab, or None when it can (root, with `ip` and `tc`)."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, veth pairs)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y iproute2)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


TCP_CC_SYSCTLS = Path("/proc/sys/net/ipv4")


def tcp_cc_refusal(name: str) -> str | None:
    """Why the lab's hosts cannot use TCP congestion control ``name``, or None when they can (or when
    this machine cannot tell: ``_set_tcp_cc`` then says what the namespace refused). Outside the
    machine's own network namespace the kernel lets a namespace choose only from the machine's
    ``tcp_allowed_congestion_control``, so the others are refused here, before a lab or a benchmark
    starts."""
    name = name.strip()
    if not name:
        return None
    try:
        allowed = (TCP_CC_SYSCTLS / "tcp_allowed_congestion_control").read_text().split()
        available = (TCP_CC_SYSCTLS / "tcp_available_congestion_control").read_text().split()
    except OSError:
        return None
    if name in allowed:
        return None
    why = f"TCP congestion control {name!r} cannot be set in the lab's namespaces"
    if name not in available:
        return f"{why}: it is not among the kernel's loaded ones (net.ipv4.tcp_available_congestion_control: {' '.join(available) or 'none'})"
    return (
        f"{why}: they may use only net.ipv4.tcp_allowed_congestion_control ({' '.join(allowed) or 'none'}); "
        f"root can add it (sysctl -w net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, name])}')"
    )


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, raising LabError with its stderr when it fails (and ``check`` is set)."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def in_netns(ns: str, fn: Callable[[], T], timeout: float = 30.0) -> T:
    """Call ``fn`` in a fresh thread that has joined namespace ``ns``; the caller's thread stays put.

    setns(2) moves only the calling thread, so a socket made inside ``fn`` lives in ``ns``.
    """
    result: list[Any] = []

    def body() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns}")
            finally:
                os.close(fd)
            result.append((True, fn()))
        except Exception as exc:  # handed to the caller's thread below
            result.append((False, exc))

    thread = threading.Thread(target=body, name=f"netns-{ns}", daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        raise LabError(f"a call inside namespace {ns} did not return within {timeout:.0f} s")
    ok, value = result[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _registry(prefix: str) -> Path:
    return REGISTRY / f"{prefix}.json"


def _control_path(prefix: str) -> Path:
    return REGISTRY / f"{prefix}.hub"  # short: a Unix socket's path is at most 107 bytes


def _ns_pids(ns: str) -> list[int]:
    proc = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def kill_namespace_processes(ns: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process in ``ns``, SIGKILL what is left after ``grace_s``; returns their pids."""
    pids = _ns_pids(ns)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _ns_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _ns_pids(ns):
        _signal(pid, signal.SIGKILL)
    return pids


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------------------- plan
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def plan_hosts(party_roles: list[tuple[str, str]], prefix: str, proxy_host: bool) -> list[Host]:
    """Namespaces, addresses and ports for the roster (in order) and, optionally, the proxy host."""
    entries = list(party_roles) + ([(PROXY_HOST, "proxy")] if proxy_host else [])
    if proxy_host and PROXY_HOST in [n for n, _ in party_roles]:
        raise LabError(f"a party is named {PROXY_HOST!r}; that name is the lab's proxy host")
    namespaces = [f"{prefix}-{_safe(n)}" for n, _ in entries]
    if len(set(namespaces)) != len(namespaces) or f"{prefix}-sw" in namespaces:
        raise LabError(f"party names {[n for n, _ in entries]} do not give distinct namespace names")
    if FIRST_HOST + len(entries) >= SUBNET.num_addresses - 1:
        raise LabError(f"{len(entries)} hosts do not fit in {SUBNET}")
    hosts, next_port = [], COORDINATOR_PORT + 1
    for i, ((name, role), ns) in enumerate(zip(entries, namespaces, strict=True)):
        if role == "coordinator":
            port = COORDINATOR_PORT
        elif role == "proxy":
            port = PROXY_PORT
        else:
            port, next_port = next_port, next_port + 1
        hosts.append(Host(name, role, ns, str(SUBNET[FIRST_HOST + i]), port, f"p{i}"))
    return hosts


def lab_config(
    lab: Lab, run_id: str, runs_dir: Path, tls_dir: Path | None = None, via: str | None = None
) -> dict[str, Any]:
    """The input config with the lab's addresses filled in; plaintext, or mutual TLS with ``tls_dir``'s
    certificates; ``via`` names a party that peers reach through the proxy host."""
    cfg = load_config(lab.source_config)
    data = cfg.to_dict()
    data["run"].update(id=run_id, dir=str(runs_dir))
    for party in data["parties"]:
        party["address"] = lab.host(party["name"]).endpoint
        party["via"] = ""
    if via is not None:
        proxy = lab.proxy
        if proxy is None:
            raise LabError(
                f"--via-proxy needs a proxy host: bring the lab up with --proxy-host (lab {lab.prefix!r})"
            )
        target = next((p for p in data["parties"] if p["name"] == via), None)
        if target is None or target["role"] == "coordinator":
            raise LabError(
                f"--via-proxy {via!r}: expected the name of an active or passive party in the roster"
            )
        target["via"] = proxy.endpoint
    transport = data["transport"]
    if tls_dir is not None:
        transport["tls"] = {
            "enabled": True,
            "ca": str(tls_dir / "ca.pem"),
            "cert": str(tls_dir / "{name}.pem"),
            "key": str(tls_dir / "{name}.key"),
        }
        transport["allow_plaintext_remote"] = False
    else:
        transport["tls"] = {"enabled": False}
        transport["allow_plaintext_remote"] = True  # the lab's own isolated subnet: plaintext is the point
    return data


def write_yaml(path: Path, data: dict[str, Any], header: str) -> None:
    path.write_text(
        "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(data, sort_keys=False)
    )


# ------------------------------------------------------------------------------------------- up
def kernel_has_netem(ns: str) -> bool:
    """Probe on namespace ``ns``'s loopback (so the host's own interfaces are never touched)."""
    if sh(*f"ip netns exec {ns} tc qdisc add dev lo root netem delay 1ms".split(), check=False).returncode:
        return False
    sh(*f"ip netns exec {ns} tc qdisc del dev lo root".split(), check=False)
    return True


def _new_namespace(ns: str) -> None:
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    # IPv4 on the lab subnet only: no IPv6 link-local chatter on the wire or in proxy traces.
    ipv6_off = "net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
    sh(*f"ip netns exec {ns} sysctl -qw {ipv6_off}".split(), check=False)


def _set_tcp_cc(ns: str, name: str) -> None:
    """The congestion control of every TCP socket made in ``ns`` from now on. The machine's default
    (e.g. bbr) paces a message of a few KB out at the rate it has measured on the connection, which
    on a delayed link adds to every message (docs/performance.md, "Step time over a network"); a
    namespace may choose only from the machine's ``tcp_allowed_congestion_control``."""
    done = sh(
        "ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={name}", check=False
    )
    if done.returncode != 0:
        allowed = sh(
            "ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_allowed_congestion_control", check=False
        )
        raise LabError(
            f"TCP congestion control {name!r} cannot be set in the lab's namespaces "
            f"({done.stderr.strip() or done.stdout.strip()}); allowed here: {allowed.stdout.strip() or 'unknown'}"
        )


def up(
    config: str | Path,
    *,
    prefix: str = "vfl",
    lab_dir: str | Path | None = None,
    netem: str = "",
    proxy_host: bool = False,
    emulator: str = "auto",
    seed: int = 0,
    tcp_cc: str = "",
) -> Lab:
    """Create the namespaces, links and impairment for ``config``'s roster; write lab.json and config.yaml."""
    if not _PREFIX.match(prefix):
        raise LabError(
            f"prefix {prefix!r}: expected 1-16 lowercase letters, digits or '-', starting with a letter"
        )
    if emulator not in ("auto", "netem", "userspace"):
        raise LabError(f"emulator {emulator!r}: expected auto, netem or userspace")
    reason = unavailable_reason() or tcp_cc_refusal(tcp_cc)
    if reason:
        raise LabError(reason)
    config = Path(config).resolve()
    cfg = load_config(config)
    hosts = plan_hosts([(p.name, p.role) for p in cfg.parties], prefix, proxy_host)
    lab_path = Path(lab_dir or Path("runs") / f"lab-{prefix}").resolve()
    lab = Lab(
        prefix=prefix,
        lab_dir=str(lab_path),
        source_config=str(config),
        switch_ns=f"{prefix}-sw",
        hosts=hosts,
        netem=netem.strip(),
        tcp_cc=tcp_cc.strip(),
    )
    existing = set(sh("ip", "netns", "list").stdout.split())
    clash = [ns for ns in lab.namespaces if ns in existing]
    if _registry(prefix).exists() or clash:
        raise LabError(
            f"a lab with prefix {prefix!r} is already up ({', '.join(clash) or _registry(prefix)}); "
            f"run `vflnet lab down --prefix {prefix}` first"
        )
    lab_path.mkdir(parents=True, exist_ok=True)
    REGISTRY.mkdir(parents=True, exist_ok=True)
    _registry(prefix).write_text(json.dumps({"lab_dir": lab.lab_dir, "namespaces": lab.namespaces}) + "\n")
    try:
        _build(lab, emulator, seed)
    except BaseException:
        down(prefix)
        raise
    lab.save()
    write_yaml(
        lab.config_path,
        lab_config(lab, cfg.run.id or f"lab-{prefix}", lab.dir / "runs"),
        f"Generated by `vflnet lab up` from {config}: the roster at the lab's addresses.\n"
        "`vflnet lab run` derives each run's own config (run id, TLS, proxy) from the source config.",
    )
    return lab


def _build(lab: Lab, emulator: str, seed: int) -> None:
    sw = lab.switch_ns
    _new_namespace(sw)
    if emulator == "userspace":  # the hub also without --netem: impairment can then change mid-run
        lab.emulator = "userspace"
    if lab.netem:
        if emulator == "auto":
            emulator = "netem" if kernel_has_netem(sw) else "userspace"
        elif emulator == "netem" and not kernel_has_netem(sw):
            raise LabError("this kernel has no sch_netem; use --emulator userspace (or auto)")
        if emulator == "userspace":
            from vflnet.tools.lab.switch import parse_netem

            try:
                parse_netem(lab.netem)
            except ValueError as exc:
                raise LabError(str(exc)) from exc
        lab.emulator = emulator
    if lab.emulator != "userspace":
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
    for h in lab.hosts:
        _new_namespace(h.ns)
        sh(*f"ip -n {sw} link add {h.switch_port} type veth peer name eth0 netns {h.ns}".split())
        if lab.emulator != "userspace":
            sh("ip", "-n", sw, "link", "set", h.switch_port, "master", "br0")
        sh("ip", "-n", sw, "link", "set", h.switch_port, "up")
        sh("ip", "-n", h.ns, "addr", "add", f"{h.address}/{SUBNET.prefixlen}", "dev", "eth0")
        sh("ip", "-n", h.ns, "link", "set", "eth0", "up")
        if lab.emulator == "netem":
            sh(*f"ip netns exec {h.ns} tc qdisc add dev eth0 root netem {lab.netem}".split())
        if lab.tcp_cc:
            _set_tcp_cc(h.ns, lab.tcp_cc)
    if lab.emulator == "userspace":
        lab.switch_pid = _start_hub(lab, seed)


def _start_hub(lab: Lab, seed: int) -> int:
    ready = lab.dir / "switch.ready"
    ready.unlink(missing_ok=True)
    log = (lab.dir / "switch.log").open("ab")
    cmd = [
        "ip",
        "netns",
        "exec",
        lab.switch_ns,
        sys.executable,
        "-m",
        "vflnet.tools.lab.switch",
        *(h.switch_port for h in lab.hosts),
        "--netem",
        lab.netem,
        "--seed",
        str(seed),
        "--ready-file",
        str(ready),
        "--control",
        str(_control_path(lab.prefix)),
    ]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.close()
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None:
            raise LabError(
                f"the userspace switch exited with code {proc.returncode}; see {lab.dir / 'switch.log'}"
            )
        if time.monotonic() > deadline:
            raise LabError(f"the userspace switch did not start within 30 s; see {lab.dir / 'switch.log'}")
        time.sleep(0.05)
    lab.control = str(_control_path(lab.prefix))
    return proc.pid


# --------------------------------------------------------------------------------------- impair
def require_hub(lab: Lab) -> None:
    """LabError unless ``lab`` forwards through the userspace hub, which takes changes mid-run."""
    if lab.emulator == "userspace" and not lab.control:
        raise LabError(
            f"the userspace hub of lab {lab.prefix!r} takes no changes (an older vflnet brought it up); "
            f"bring the lab down and up again (`vflnet lab down --prefix {lab.prefix}`)"
        )
    if lab.emulator != "userspace":
        kernel = "tc netem" if lab.emulator == "netem" else "a bridge"
        raise LabError(
            f"lab {lab.prefix!r} forwards with the kernel ({kernel}): impairment that changes while a run "
            "goes on needs the userspace hub; bring the lab up with --emulator userspace"
        )


def hub_command(lab: Lab, line: str) -> dict[str, Any]:
    """One line to the running hub (see switch.Hub.command); its reply, or LabError with its error."""
    require_hub(lab)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10.0)
            conn.connect(lab.control)
            conn.sendall(line.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        reply: dict[str, Any] = json.loads(data)
    except (OSError, ValueError) as exc:
        raise LabError(
            f"the userspace hub of lab {lab.prefix!r} did not answer on {lab.control} ({exc}); is the lab up? "
            f"see {lab.dir / 'switch.log'}"
        ) from exc
    if not reply.get("ok"):
        raise LabError(f"the userspace hub refused {line!r}: {reply.get('error')}")
    return reply


def impair(lab: Lab, party: str, settings: list[str]) -> dict[str, Any]:
    """Set host ``party``'s impairment (``KEY=VALUE`` with delay, jitter, loss, rate; ``clear``) or
    take its link ``down`` / ``up``, now, on the running hub; returns the host's state after it."""
    from vflnet.tools.lab.switch import parse_impair

    host = lab.host(party)
    try:
        parse_impair(settings)
    except ValueError as exc:
        raise LabError(f"lab impair {party}: {exc}") from exc
    return hub_command(lab, " ".join([host.switch_port, *settings]))["ports"][host.switch_port]  # type: ignore[no-any-return]


def impairments(lab: Lab) -> dict[str, dict[str, Any]]:
    """Every host's link state and impairment, by host name, from the running hub."""
    ports = hub_command(lab, "show")["ports"]
    return {h.name: ports[h.switch_port] for h in lab.hosts if h.switch_port in ports}


# ----------------------------------------------------------------------------------------- down
def down(prefix: str = "vfl") -> list[str]:
    """Stop every process in the lab's namespaces and delete them (their veths and bridge go with
    them); returns the namespaces deleted. A lab that is not up is not an error."""
    record = _registry(prefix)
    try:
        namespaces = json.loads(record.read_text())["namespaces"]
    except (OSError, ValueError, KeyError):
        return []
    existing = set(sh("ip", "netns", "list").stdout.split())
    deleted = []
    for ns in namespaces:
        if ns not in existing:
            continue
        kill_namespace_processes(ns)
        sh("ip", "netns", "del", ns)
        deleted.append(ns)
    _control_path(prefix).unlink(missing_ok=True)
    record.unlink(missing_ok=True)
    return deleted


def running_lab(prefix: str) -> Lab:
    """The lab that is up under ``prefix`` (its record names its directory)."""
    try:
        lab_dir = json.loads(_registry(prefix).read_text())["lab_dir"]
    except (OSError, ValueError, KeyError):
        raise LabError(
            f"no lab with prefix {prefix!r} is up (`vflnet lab up CONFIG --prefix {prefix}`)"
        ) from None
    return Lab.open(lab_dir)


def is_up(lab: Lab) -> bool:
    """Whether ``lab``'s namespaces all exist (under its prefix's record)."""
    if not _registry(lab.prefix).exists():
        return False
    existing = set(sh("ip", "netns", "list").stdout.split())
    return all(ns in existing for ns in lab.namespaces)


def lab_processes(lab: Lab) -> dict[str, list[int]]:
    """Processes running in the lab's host namespaces (the userspace switch is not counted)."""
    return {h.ns: pids for h in lab.hosts if (pids := _ns_pids(h.ns))}
