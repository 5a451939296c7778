"""Warm start: role processes forked from a fork server that has torch and vflnet imported already.

A cold start (`python -m vflnet party ...`) spends seconds importing torch in every process. The fork
server is one such interpreter, started once with the children's environment; it imports everything
a role process imports (:data:`PRELOAD`) and then only forks. Each child is a fresh process: it gets
its command line, environment, working directory and log file from the request, runs ``vflnet ARGS``
exactly as ``python -m vflnet ARGS`` would, and exits through the interpreter's normal shutdown (its
exit code, or the signal that killed it, reaches the requester). Nothing a child does reaches the
server or another child. The server only imports: no torch op runs and no gRPC channel or server is
made in it, so no thread pool exists to be lost by a fork (numpy's OpenBLAS pool is OpenBLAS's own:
it stops its threads around fork).

Lifetimes, as for cold children (vflnet/runner/parent_death.py):

- the server dies with the process that started it (PR_SET_PDEATHSIG), and every child dies with the
  server;
- a child dies with the process that asked for it: the server holds each requester's connection and
  sends the child SIGTERM when the requester hangs up (it died, or dropped the handle);
- a child that crashes or is killed is reaped by the server, which reports its exit status; the
  server goes on serving.

A process the server started can ask it for more children (``vflnet sweep``'s runs start their role
processes from the sweep's server): :data:`SOCKET_ENV` names its socket and its torch thread count.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from vflnet.runner.parent_death import ENV as PARENT_ENV
from vflnet.runner.parent_death import child_env

# what the server imports before it forks, with every registry's built-ins: what a role process or a
# run's launcher imports anyway
PRELOAD = (
    "torch",
    "torch._dynamo",  # torch.optim imports it with the first optimizer (~2 s)
    "torch._dynamo.convert_frame",  # and this at its first step
    "grpc",
    "vflnet.cli",
    "vflnet.commands.party",
    "vflnet.commands.run",
    "vflnet.roles.party",
    "vflnet.roles.coordinator",
    "vflnet.roles.proxy",
    "vflnet.runner.local",
    "vflnet.runner.loopback",
    "vflnet.runner.scoring",
    "vflnet.tools.experiments.sweep",
)
PRELOAD_IF_INSTALLED = ("matplotlib.figure",)  # the plots extra: an attack's pictures
SOCKET_ENV = "VFLNET_FORK_SERVER"
STATUS = struct.Struct("i")  # a child's pid, then its exit code (negative: the signal that killed it)
SERVER_GONE = 255  # the exit code reported when the server died before the child's status came
MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT_S = 10.0  # a connected caller sends its request at once
# the server's program: the fork loop below, whose children run the `vflnet` command's entry point
# (named here, not imported: the CLI starts runs through this module)
SERVER_COMMAND = "from vflnet.cli import main as entry; from vflnet.runner.warm import main; main(entry)"
INTERRUPTED = -int(signal.SIGINT)  # _run_vflnet's code for an uncaught KeyboardInterrupt


class ForkServerError(RuntimeError):
    """The fork server could not start a process."""


class WarmProcess:
    """A child of the fork server, handled like a ``subprocess.Popen``: pid, poll, wait, returncode,
    terminate, kill. Its exit status comes over the connection that asked for it."""

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.server_gone = False  # the server ended before it reported the child's status
        self._conn = conn

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"warm child {self.pid}", timeout or 0.0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def _read_status(self) -> None:
        data = self._conn.recv(STATUS.size)
        self.returncode = STATUS.unpack(data)[0] if data else SERVER_GONE
        self.server_gone = not data
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not yet reaped: the pid is still this child's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class ForkServer:
    """A fork server's socket, the ``runtime.torch_threads`` its children's environment is for, and the
    server process itself when this process started it."""

    path: Path
    torch_threads: int
    proc: subprocess.Popen[bytes] | None = None

    def offer(self) -> dict[str, str]:
        """The environment entry through which a child uses this server too."""
        return {SOCKET_ENV: f"{self.torch_threads}:{self.path}"}

    def spawn(
        self, args: list[str], env: dict[str, str], log: IO[bytes], timeout_s: float | None
    ) -> WarmProcess:
        """Start ``vflnet ARGS`` with ``env``, stdout and stderr to ``log``, this working directory.
        Waits up to ``timeout_s`` (None: no limit) for the pid: the server may still be importing."""
        return self._request(args, env, [log.fileno()], None, timeout_s)

    def spawn_attached(self, args: list[str], env: dict[str, str]) -> WarmProcess:
        """Start ``vflnet ARGS`` with ``env`` on this process's stdin, stdout and stderr, working
        directory and umask, as if this process ran it (a resident server's client)."""
        return self._request(args, env, _stdio_fds(), _umask(), None)

    def _request(
        self, args: list[str], env: dict[str, str], fds: list[int], umask: int | None, timeout_s: float | None
    ) -> WarmProcess:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(timeout_s)
            conn.connect(str(self.path))
            request = json.dumps({"args": args, "env": env, "cwd": os.getcwd(), "umask": umask}).encode()
            socket.send_fds(conn, [request], fds)
            data = conn.recv(STATUS.size)
        except OSError as exc:  # timeouts included
            conn.close()
            raise ForkServerError(f"the fork server at {self.path} did not start {args[:1]}: {exc}") from exc
        if not data:
            conn.close()
            raise ForkServerError(
                f"the fork server at {self.path} exited (its errors are on the launcher's stderr)"
            )
        conn.settimeout(None)
        return WarmProcess(STATUS.unpack(data)[0], conn)


def _umask() -> int:
    """This process's umask, read without setting it (another thread may be creating a file)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise OSError("no Umask in /proc/self/status")


def _stdio_fds() -> list[int]:
    """This process's stdin, stdout and stderr, /dev/null for one that is closed."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


Process = subprocess.Popen[bytes] | WarmProcess


def start_vflnet(
    args: list[str], env: dict[str, str], log: IO[bytes], server: ForkServer | None, timeout_s: float | None
) -> Process:
    """``vflnet ARGS`` with ``env``, stdout and stderr to ``log``, that dies with this process: forked
    from ``server`` (warm), or a new interpreter when it is None (cold)."""
    if server is not None:
        return server.spawn(args, env, log, timeout_s)
    return subprocess.Popen(
        [sys.executable, "-m", "vflnet", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=child_env(env),
    )


def role_env(torch_threads: int) -> dict[str, str]:
    """The environment of a run's role processes, cold or warm (a fork server is started with it)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(torch_threads))


# a Unix socket's path must fit sockaddr_un.sun_path (108 bytes with its NUL on Linux)
SUN_PATH_MAX = 107


def _socket_folder() -> Path:
    """A private new folder for the server's socket: in the temporary folder ($TMPDIR), or in /tmp
    when $TMPDIR is too deep for a socket's path (a test's or a CI job's folder can be)."""
    folder = Path(tempfile.mkdtemp(prefix="vflnet-fork-"))
    if len(os.fsencode(folder / "server.sock")) <= SUN_PATH_MAX:
        return folder
    folder.rmdir()
    return Path(tempfile.mkdtemp(prefix="vflnet-fork-", dir="/tmp"))


@contextmanager
def fork_server(torch_threads: int) -> Iterator[ForkServer]:
    """Start a fork server with the environment of role processes for ``torch_threads`` (its
    import-time settings); stopped, by its pid, on leaving. It dies with this process if this process
    dies first."""
    folder = _socket_folder()
    path = folder / "server.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # bound and listening before the server starts: requests wait in the backlog while it imports
        listener.bind(str(path))
        listener.listen(64)
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_COMMAND, str(listener.fileno())],
            pass_fds=[listener.fileno()],
            stdin=subprocess.DEVNULL,
            env=child_env(role_env(torch_threads)),
        )
    finally:
        listener.close()
    try:
        yield ForkServer(path, torch_threads, proc)
    finally:
        proc.terminate()  # its children have ended (or end with it: PR_SET_PDEATHSIG)
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def offered_fork_server(torch_threads: int) -> Iterator[ForkServer]:
    """A fork server started now and offered (``SOCKET_ENV``) to what this process runs next, as
    ``vflnet sweep`` offers one to its runs; stopped, and the previous offer restored, on leaving."""
    with fork_server(torch_threads) as server:
        before = os.environ.get(SOCKET_ENV)
        os.environ.update(server.offer())
        try:
            yield server
        finally:
            if before is None:
                os.environ.pop(SOCKET_ENV, None)
            else:
                os.environ[SOCKET_ENV] = before


def shared_server() -> ForkServer | None:
    """The fork server this process was started from, when its starter offers it (``SOCKET_ENV``)."""
    offered = os.environ.get(SOCKET_ENV)
    if not offered:
        return None
    threads, path = offered.split(":", 1)
    return ForkServer(Path(path), int(threads))


@dataclass
class _Request:
    args: list[str]
    env: dict[str, str]
    cwd: str
    umask: int | None
    stdio: list[int]  # one log file for stdout and stderr, or stdin, stdout and stderr
    server_pid: int


@dataclass(frozen=True)
class Residence:
    """What makes a fork server resident (vflnet/runner/resident.py): it offers itself to its children
    (``offer``, the value of :data:`SOCKET_ENV`), ends after ``idle_s`` seconds without a child,
    removes ``files`` (its socket, its description) when it ends, and writes a line to ``ready_fd``
    once its imports are done."""

    offer: str
    idle_s: float
    files: tuple[str, ...]
    ready_fd: int


def _peer_uid(conn: socket.socket) -> int:
    pid_uid_gid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", pid_uid_gid)[1]


def _serve(listener: socket.socket, idle_s: float | None) -> _Request | None:
    """Fork a child for every request. Returns a child's request in that child; None in the server
    when it has had no child and no request for ``idle_s`` seconds (None: it serves until stopped)."""
    server_pid = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the selector
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the children, not the server
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    requesters: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    idle_since = time.monotonic()
    while True:
        timeout = None
        if idle_s is not None and not requesters:
            timeout = max(0.0, idle_since + idle_s - time.monotonic())
        events = selector.select(timeout)
        if not events and timeout is not None and not requesters:
            selector.close()
            return None
        for key, _ in events:
            if key.fileobj is listener:
                conn, _ = listener.accept()
                idle_since = time.monotonic()
                if _peer_uid(conn) != os.getuid():  # the socket's folder is private: belt and braces
                    conn.close()
                    continue
                conn.settimeout(REQUEST_TIMEOUT_S)  # a caller that connects and stalls holds no one up
                try:
                    message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
                except OSError:
                    conn.close()
                    continue
                conn.settimeout(None)
                if not fds:  # the requester hung up (died) before it asked
                    conn.close()
                    continue
                request = json.loads(message)
                pid = os.fork()
                if pid == 0:
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    for other in (listener, conn, *requesters.values()):
                        other.close()
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    return _Request(
                        request["args"], request["env"], request["cwd"], request.get("umask"), fds, server_pid
                    )
                for fd in fds:
                    os.close(fd)
                try:
                    conn.send(STATUS.pack(pid))
                except OSError:  # the requester is gone: the selector sees it hang up, below
                    pass
                requesters[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            elif key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(requesters, selector)
                idle_since = time.monotonic()
            else:  # the requester hung up: its child goes with it, as with PR_SET_PDEATHSIG
                selector.unregister(key.fileobj)
                os.kill(key.data, signal.SIGTERM)


def _reap(requesters: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = requesters.pop(pid)
        if conn in selector.get_map():  # not if its requester hung up already
            selector.unregister(conn)
        try:
            conn.send(STATUS.pack(os.waitstatus_to_exitcode(status)))
        except OSError:  # the requester is gone
            pass
        conn.close()


def _become(request: _Request, residence: Residence | None) -> None:
    """Turn this forked copy of the server into the requested ``vflnet ARGS`` process."""
    if len(request.stdio) == 3:
        for target, fd in enumerate(request.stdio):
            os.dup2(fd, target)
    else:
        os.dup2(request.stdio[0], 1)
        os.dup2(request.stdio[0], 2)
    for fd in request.stdio:
        if fd > 2:
            os.close(fd)
    os.chdir(request.cwd)
    if request.umask is not None:
        os.umask(request.umask)
    os.environ.clear()
    # vflnet's main asks for SIGTERM when the server (this process's parent) dies
    os.environ.update(request.env, **{PARENT_ENV: str(request.server_pid)})
    if residence is not None:  # what it runs starts its own processes from the same server
        os.environ[SOCKET_ENV] = residence.offer
        # a resident server was started without a thread setting: a command asking for one (a role
        # process: runtime.torch_threads) gets it here, before its first torch op
        if request.env.get("OMP_NUM_THREADS", "").isdigit():
            import torch

            torch.set_num_threads(int(request.env["OMP_NUM_THREADS"]))
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    sys.argv = ["vflnet", *request.args]
    import numpy

    numpy.random.seed()  # fresh entropy, as a new interpreter has (random reseeds itself at fork)


def main(entry: Callable[[list[str]], int]) -> None:
    """The fork server: import, then fork a child per request that runs ``entry(ARGS)`` (`vflnet ARGS`).
    Its arguments: the listening socket's fd, then a resident server's :class:`Residence` as JSON."""
    from vflnet.runner.parent_death import die_with_parent_if_asked

    die_with_parent_if_asked()
    listener = socket.socket(fileno=int(sys.argv[1]))
    residence = Residence(**json.loads(sys.argv[2])) if len(sys.argv) > 2 else None
    if residence is not None:  # `vflnet warm stop`: its files go with it; its children die with it
        own_socket = os.stat(residence.files[0]).st_ino
        signal.signal(signal.SIGTERM, lambda *_: _leave(residence, own_socket, 0))
    for module in PRELOAD:
        importlib.import_module(module)
    for module in PRELOAD_IF_INSTALLED:
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            importlib.import_module(module)
    from vflnet import registry

    for built_ins in (
        registry.ATTACKS,
        registry.DEFENSES,
        registry.DATASETS,
        registry.MODELS,
        registry.PROTOCOLS,
    ):
        built_ins.names()  # imports every built-in module, as a process's first lookup does
    # what is imported stays out of the children's collections (their exit's included): a collection
    # would touch every object, copying each page the child shares with the server
    gc.freeze()
    if residence is not None:
        os.write(residence.ready_fd, b"ready\n")
        os.close(residence.ready_fd)
    request = _serve(listener, residence.idle_s if residence is not None else None)
    if request is None:
        assert residence is not None
        _leave(residence, own_socket, 0)
    assert request is not None
    _become(request, residence)
    code = _run_vflnet(entry, request.args)
    # the interpreter's exit without its last step: joining threads (as multiprocessing's children
    # do), atexit, flushing; tearing down every module would copy each page shared with the server
    threading._shutdown()  # type: ignore[attr-defined]
    _skip_op_library_teardown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == INTERRUPTED:  # an uncaught KeyboardInterrupt: the process ends by SIGINT, as Python's does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _skip_op_library_teardown() -> None:
    """Keep torch's op libraries registered at exit: each of the ~130 deregisters itself there (a
    weakref.finalize), work for an interpreter that goes on, not for a child about to ``os._exit``, and
    ~40 ms of a forked child's exit (pages copied from the server). Every other finalizer still runs
    (a temporary folder's removal)."""
    import torch.library

    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        held = finalizer.peek()
        if held is not None and held[1] is torch.library._del_library:
            finalizer.atexit = False


def _leave(residence: Residence, own_socket: int, code: int) -> None:
    """A resident server's end: its files removed first, so that no new request reaches it; not
    when its socket's path names another server's socket by now."""
    with contextlib.suppress(FileNotFoundError):
        if os.stat(residence.files[0]).st_ino == own_socket:
            for name in residence.files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
    os._exit(code)


def _run_vflnet(entry: Callable[[list[str]], int], args: list[str]) -> int:
    """``vflnet ARGS`` (``entry(ARGS)``), and the exit code the interpreter would give it."""
    try:
        return entry(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return INTERRUPTED
    except Exception:
        traceback.print_exc()
        return 1
