"""Ctrl-C and SIGTERM in a command that starts processes (`vflnet run`, `sweep`, `audit`, the benches):
the command ends with one line and exit code 130, and passes the signal that came on to what it started,
so that a run records the signal the user sent (a terminal's Ctrl-C is SIGINT, however many launchers
it went through: a resident server's client, `vflnet sweep`, `vflnet run`)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# 128 + SIGINT: what a shell reports for a command Ctrl-C ended; the same for SIGTERM, as `vflnet run` did
INTERRUPTED_EXIT = 130


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signal``: which."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(self.signal.name)


def signal_of(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal that raised ``exc``: SIGINT for Python's own KeyboardInterrupt."""
    return exc.signal if isinstance(exc, Interrupted) else signal.SIGINT


def raise_interrupted(signum: int, frame: Any) -> None:
    """A handler for SIGNALS: raise Interrupted, and ignore both from now on, so that a second signal
    (Ctrl-C reaches the whole process group, then a launcher passes it on; a second Ctrl-C) cannot cut
    the teardown that follows short. Whoever set the handler restores the previous ones after it."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise Interrupted (`raise_interrupted`). Set explicitly: a
    process started with SIGINT ignored (a background job of a script, nohup, a CI runner) would
    otherwise inherit the ignoring. The previous handlers come back when the block ends."""
    previous = {sig: signal.signal(sig, raise_interrupted) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
