"""One run per run directory: each role holds a lock file there while it runs (light: no torch, no grpc)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class RunDirInUse(RuntimeError):
    pass


@contextmanager
def role_lock(run_dir: Path, name: str) -> Iterator[None]:
    """Hold ``run_dir/locks/NAME.lock`` while role ``name`` runs: a second cluster started with the same
    run id (and so the same directory) is refused instead of interleaving metrics and overwriting
    checkpoints. The kernel drops the lock when the process dies, so a crash leaves no stale lock."""
    path = run_dir / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RunDirInUse(
                f"run directory {run_dir} is in use: {name} of another run holds {path} (pid {holder}); "
                "give this run another run.id or --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
