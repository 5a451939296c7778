"""What every role process shares: logging, headers, the serve-until-shutdown loop."""

from __future__ import annotations

import logging
import sys
import threading
import time

import grpc
import torch

from vflnet.config import Config
from vflnet.wire.errors import RpcFailure, stale_step


def setup_logging(name: str, level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def setup_torch(cfg: Config) -> None:
    # One thread per process: parties share the machine, and a fixed thread count keeps float
    # reductions identical to the in-process reference.
    torch.set_num_threads(cfg.runtime.torch_threads)
    # the flag torch.use_deterministic_algorithms sets for eager ops; that wrapper also imports
    # torch._inductor to set torch.compile's copy of it (~2 s of every process's start; nothing here
    # compiles)
    torch._C._set_deterministic_algorithms(True, warn_only=True)


class Liveness:
    """Tracks the last contact from the coordinator so a party stops if the run is abandoned."""

    def __init__(self, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._last = time.monotonic()
        self.shutdown = threading.Event()
        self.why = "shutdown"

    def stop(self, why: str) -> None:
        """End ``wait`` at once with ``why`` (the heartbeats found the coordinator dead)."""
        self.why = why
        self.shutdown.set()

    def touch(self) -> None:
        self._last = time.monotonic()

    def wait(self) -> str:
        """Block until shutdown or idleness; returns why."""
        while not self.shutdown.wait(timeout=1.0):
            if time.monotonic() - self._last > self.idle_timeout_s:
                return f"no message from the coordinator for {self.idle_timeout_s:.0f} s"
        return self.why


def wait_for(event: threading.Event, timeout: float, what: str) -> None:
    if not event.wait(timeout):
        raise RpcFailure(grpc.StatusCode.UNAVAILABLE, f"timed out after {timeout:.0f} s waiting for {what}")


__all__ = [
    "setup_logging",
    "setup_torch",
    "stale_step",
    "Liveness",
    "wait_for",
]
