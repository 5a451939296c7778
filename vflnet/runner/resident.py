"""The resident fork server: a fork server (vflnet/runner/warm.py) that outlives the command that
started it, so that a later `vflnet` command skips the interpreter's imports (torch's ~3-5 s).

`vflnet warm start` starts one for this user and this installation; it ends after
``--idle-minutes`` without a child (default 15) or on `vflnet warm stop`. While it runs, the `vflnet`
command sends its whole command line there (:func:`run_in_resident_server`): the server forks a
child that runs the command on this process's stdin, stdout and stderr, in its working directory,
with its environment and umask; this process passes on the signals it gets (Ctrl-C included) and
exits with the child's code. A run's role processes, and a sweep's runs, are forked from the same
server. Every child is a fresh fork of the imported server, as with the per-run server: nothing one
command does reaches another.

Which server a command may use is decided by :func:`installation_key`: the interpreter, the mtimes
of the folders packages are imported from, every vflnet source file (path, size, mtime), the
process's namespaces (a fork runs in the server's: a command in a lab's network namespace or a
container must not run outside it) and the environment variables read at import time. A changed
source file, an installed package or another ``OMP_NUM_THREADS`` names another server, so a command
never runs code older than its files. A command sent to the server runs in the server's cgroup and
under its resource limits, not the caller's (results do not depend on them; a terminal tab's cgroup
may differ from the next one's). The socket lives in a folder only this user can open (checked); the
server also checks each caller's uid. ``VFLNET_RESIDENT=off`` turns the whole mechanism off for a
command (the test suite does).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from vflnet.runner.warm import (
    SERVER_COMMAND,
    SOCKET_ENV,
    ForkServer,
    ForkServerError,
    Residence,
)

OFF_ENV = "VFLNET_RESIDENT"  # "off": never use a resident server; "on" (or unset): use one if it runs
SETTINGS = ("on", "off")
DIR_ENV = "VFLNET_RUNTIME_DIR"  # its folder (default: $XDG_RUNTIME_DIR/vflnet, else /tmp/vflnet-UID)
DEFAULT_IDLE_MINUTES = 15.0
LOG_NAME = "fork-servers.log"  # every resident server's stderr, in its folder
NOT_SENT = frozenset({"warm"})  # commands that always run in the calling process
# environment variables that take effect when a module is imported (threads, libraries, paths)
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "GRPC_",
    "LD_",
    "MPL",
)
NAMESPACES = ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class UnsafeFolder(RuntimeError):
    """The resident server's folder can be opened by another user, or is not a folder."""


def runtime_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).absolute()  # the server runs from /
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]).absolute() / "vflnet"
    return Path(f"/tmp/vflnet-{os.getuid()}")


def _checked(folder: Path) -> Path:
    """``folder`` when it is a real folder of this user that no one else can open."""
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UnsafeFolder(
            f"{folder} must be a folder owned by uid {os.getuid()} with mode 700 "
            f"(it is uid {info.st_uid}, mode {stat.filemode(info.st_mode)}): "
            f"the resident fork server runs commands for whoever can open its socket; set ${DIR_ENV}"
        )
    return folder


def installation_key(package: Path | None = None) -> str:
    """What a server must share with a command that uses it (the module's docstring); a few ms.
    ``package``: vflnet's source folder (tests give another)."""
    import vflnet

    package = package or Path(vflnet.__file__).parent
    digest = hashlib.sha256(sys.executable.encode())
    paths = sysconfig.get_paths()
    for folder in sorted({paths["purelib"], paths["platlib"], *os.environ.get("PYTHONPATH", "").split(":")}):
        with contextlib.suppress(OSError):
            digest.update(f"{folder}:{os.stat(folder).st_mtime_ns}\n".encode())
    for path in sorted(package.rglob("*.py")):
        with contextlib.suppress(OSError):  # gone since the listing (an editor's save, a checkout)
            info = path.stat()
            digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    # a child runs in the server's namespaces: a command in a network namespace of the lab, or in a
    # container, must not run outside it
    for kind in NAMESPACES:
        with contextlib.suppress(OSError):
            digest.update(f"{kind}:{os.readlink(f'/proc/self/ns/{kind}')}\n".encode())
    for name in sorted(os.environ):
        if name.startswith(IMPORT_TIME_PREFIXES):
            digest.update(f"{name}={os.environ[name]}\n".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ResidentFiles:
    """A resident server's socket and its description (pid, threads, idle limit, start time)."""

    socket: Path
    info: Path

    @classmethod
    def for_this_installation(cls, folder: Path) -> ResidentFiles:
        key = installation_key()
        return cls(folder / f"fork-{key}.sock", folder / f"fork-{key}.json")

    def read_info(self) -> dict[str, object] | None:
        try:
            return json.loads(self.info.read_text())
        except (OSError, ValueError):
            return None


def _files_if_safe() -> ResidentFiles | None:
    folder = runtime_dir()
    if not folder.exists():
        return None
    return ResidentFiles.for_this_installation(_checked(folder))


def running_server(files: ResidentFiles | None = None) -> tuple[ResidentFiles, dict[str, object]] | None:
    """This installation's resident server's files (``files``: found again when None) and
    description, when one answers on its socket."""
    files = files or _files_if_safe()
    if files is None or not files.socket.exists():
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(str(files.socket))  # a server gone by SIGKILL left its socket: refused
    except OSError:
        return None
    finally:
        probe.close()
    info = files.read_info()
    return (files, info) if info is not None else None


def start(torch_threads: int, idle_minutes: float, timeout_s: float) -> tuple[ResidentFiles, int, bool]:
    """Start this installation's resident server, or find the running one: its files, its pid and
    whether it was started now. Returns once its imports are done (or raises after ``timeout_s``)."""
    folder = runtime_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _checked(folder)
    with (folder / "start.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one start at a time: a second finds the first's server
        return _start(folder, torch_threads, idle_minutes, timeout_s)


def _start(
    folder: Path, torch_threads: int, idle_minutes: float, timeout_s: float
) -> tuple[ResidentFiles, int, bool]:
    files = ResidentFiles.for_this_installation(folder)
    found = running_server(files)
    if found is not None:
        return files, int(found[1]["pid"]), False  # type: ignore[call-overload]
    with contextlib.suppress(FileNotFoundError):
        files.socket.unlink()  # left by a server that was killed
    # the caller's environment, not a role process's: a command it runs gets torch's default threads
    # as in its own process; a role process sets runtime.torch_threads after the fork (warm._become)
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    env["PYTHONUNBUFFERED"] = "1"  # its children's stdout and stderr reach the terminal as written
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ready_r, ready_w = os.pipe()
    log = open(folder / LOG_NAME, "ab")  # noqa: SIM115 (closed below; the servers' own, appended)
    try:
        listener.bind(str(files.socket))
        listener.listen(64)
        residence = Residence(
            offer=f"{torch_threads}:{files.socket}",
            idle_s=idle_minutes * 60,
            files=(str(files.socket), str(files.info)),
            ready_fd=ready_w,
        )
        proc = subprocess.Popen(
            # -P: nothing is imported from the folder a command runs in, as for the `vflnet` script
            [
                sys.executable,
                "-P",
                "-c",
                SERVER_COMMAND,
                str(listener.fileno()),
                json.dumps(residence.__dict__),
            ],
            pass_fds=[listener.fileno(), ready_w],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            cwd="/",
            start_new_session=True,  # outlives this command and its terminal
        )
    finally:
        listener.close()
        log.close()
        os.close(ready_w)
    info = {
        "pid": proc.pid,
        "torch_threads": torch_threads,
        "idle_minutes": idle_minutes,
        "started": time.time(),
    }
    partial = files.info.with_suffix(".partial")
    partial.write_text(json.dumps(info))
    partial.replace(files.info)  # a reader sees the whole description or none
    try:
        with os.fdopen(ready_r, "rb") as ready:
            _wait_readable(ready.fileno(), timeout_s)
            if ready.readline() != b"ready\n":
                raise ForkServerError(
                    f"the resident fork server exited while importing; see {folder / LOG_NAME}"
                )
    except BaseException:
        stop_pid(proc.pid, timeout_s)
        raise
    return files, proc.pid, True


def _wait_readable(fd: int, timeout_s: float) -> None:
    if not select.select([fd], [], [], timeout_s)[0]:
        raise ForkServerError(f"the resident fork server did not finish its imports in {timeout_s:.0f} s")


def stop_pid(pid: int, timeout_s: float) -> bool:
    """SIGTERM to ``pid`` and wait (a pidfd, no polling) up to ``timeout_s`` for it to end."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
        _wait_readable(pidfd, timeout_s)
    finally:
        os.close(pidfd)
    return True


def run_in_resident_server(args: list[str]) -> int | None:
    """Run ``vflnet ARGS`` in this installation's resident server, as if in this process: its exit
    code, or None when no server is running (or it did not take the command) and this process runs it."""
    setting = os.environ.get(OFF_ENV) or "on"
    if setting not in SETTINGS:  # a misspelt "off" must not leave it on
        print(f"vflnet: {OFF_ENV} must be one of {list(SETTINGS)}, not {setting!r}", file=sys.stderr)
        return 2
    if setting == "off" or not args or args[0] in NOT_SENT or args[0].startswith("-"):
        return None
    try:
        files = _files_if_safe()
    except (UnsafeFolder, OSError) as exc:
        print(f"vflnet: not using a resident fork server: {exc}", file=sys.stderr)
        return None
    info = files.read_info() if files is not None and files.socket.exists() else None
    if files is None or info is None:
        return None
    server = ForkServer(files.socket, int(info["torch_threads"]))  # type: ignore[call-overload]
    try:
        child = server.spawn_attached(args, dict(os.environ))
    except ForkServerError:  # none answers (it was killed, or was ending idle): the command runs here
        return None

    def forward(number: int, _: object) -> None:
        if child.returncode is None:  # not yet reported: the pid is still the child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, number)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    code = child.wait()
    if child.server_gone:
        print(f"vflnet: the resident fork server {info['pid']} ended during the command", file=sys.stderr)
    if code < 0:  # the child ended by a signal: so does this process, as the shell expects
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's and SIGSTOP's cannot be changed
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code
