"""Children that die with the process that started them (Linux PR_SET_PDEATHSIG), set up in the child.

The launcher does not use ``preexec_fn`` for this: Python code between fork and exec in a process
that has live gRPC threads runs gRPC's fork handlers, which abort the child (epoll_wait: Bad file
descriptor) when they are skipped. A child started with :func:`child_env` asks the kernel for SIGTERM
when its parent dies, first thing in ``vflnet``'s main, and stops at once if the parent is already
gone (the race between fork and that request)."""

from __future__ import annotations

import ctypes
import os
import signal

ENV = "VFLNET_PARENT_PID"
PR_SET_PDEATHSIG = 1


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child that must not outlive this process."""
    return {**env, ENV: str(os.getpid())}


def die_with_parent_if_asked() -> None:
    parent = os.environ.pop(ENV, None)  # not inherited further: a grandchild has another parent
    if parent is None:
        return
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
