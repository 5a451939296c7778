"""The step mailbox: what one side gathers from several senders for a step, then answers each of them.

The receiving side's handler ``put``s a sender's message for a step and waits for its answer; the
side's step ``collect``s every sender's message (within a deadline), computes, and ``answer``s each
sender, or ``fail``s the step (every waiting sender gets the reason as ``aborted``); ``stop`` fails
every step under way at shutdown. Steps are taken in order: a message for a step already done, or for
one past the next, is refused (``stale_step``), and the next step's messages may arrive while the
current step is still being computed (a pipelined schedule). Every message of a step names the sample
ids it is for; those must be the step's (the ids its collector names).

Used by split, and through it by split-he, hashvfl and param-server (vflnet/protocols/split.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from vflnet.wire.errors import aborted, duplicate, invalid, stale_step

M = TypeVar("M")  # what a sender puts
R = TypeVar("R")  # what it is answered


@dataclass
class _Slot(Generic[M, R]):
    """Everything one step gathers, whichever message arrives first."""

    step: int
    full: threading.Condition  # the collector's wait for every sender (on the mailbox's lock)
    ids: np.ndarray | None = None  # the step's sample ids, once its collector names them
    messages: dict[str, tuple[np.ndarray, M]] = field(default_factory=dict)  # sender -> (ids, message)
    replies: dict[str, R] = field(default_factory=dict)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class StepMailbox(Generic[M, R]):
    """Messages of ``senders`` for each step, at ``where`` (for errors: "the active party"); ``what``
    the messages are called in errors ("embeddings"). ``completed_step`` is the last step answered
    (a side's checkpoint keeps it)."""

    def __init__(self, senders: Sequence[str], what: str, where: str) -> None:
        self.senders = list(senders)
        self.what, self.where = what, where
        self.lock = threading.RLock()  # of the slots and what is in them
        self.arrived = threading.Condition(self.lock)  # notified at every message that is put
        self.slots: dict[int, _Slot[M, R]] = {}
        self.completed_step = 0

    def _slot(self, step: int) -> _Slot[M, R]:
        """Holding the lock: the slot of ``step``, made at its first message or its collector."""
        if step <= self.completed_step:
            raise stale_step(f"step {step} is not current: step {self.completed_step} is already done")
        if step > self.completed_step + 1:  # nothing parks a slot for a step the schedule has not reached
            raise stale_step(f"step {step} is out of order: step {self.completed_step + 1} is next")
        if step not in self.slots:
            self.slots[step] = _Slot(step, threading.Condition(self.lock))
        return self.slots[step]

    def put(self, step: int, sender: str, ids: np.ndarray, message: M, timeout: float) -> R:
        """``sender``'s ``message`` for ``step`` (about samples ``ids``); its answer, once the step
        is answered. Raises ``aborted`` when the step fails, TimeoutError after ``timeout`` s."""
        with self.lock:
            slot = self._slot(step)
            if sender in slot.messages:
                raise duplicate(f"{sender} already sent {self.what} for step {step}")
            if slot.ids is not None and not np.array_equal(ids, slot.ids):
                raise invalid(f"{sender} sent {self.what} for other sample ids than step {step} schedules")
            slot.messages[sender] = (ids, message)
            self.arrived.notify_all()
            if len(slot.messages) == len(self.senders):  # the step waits for them all, not for each
                slot.full.notify()
        if not slot.done.wait(timeout):
            raise TimeoutError(f"step {step} did not complete within {timeout:.0f} s")
        if slot.error is not None:
            raise aborted(f"step {step} failed at {self.where}: {slot.error}")
        return slot.replies[sender]

    def collect(self, step: int, ids: np.ndarray, timeout: float) -> list[M]:
        """Every sender's message for ``step``, in the order of ``senders``, once all are in; the
        step's sample ids are ``ids``. The step fails (``aborted``) when a sender's ids differ, or
        when a sender has sent nothing within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self.lock:
            slot = self._slot(step)
            slot.ids = ids
            for sender, (got, _) in slot.messages.items():
                if not np.array_equal(got, ids):
                    self._fail(
                        slot, f"{sender} sent {self.what} for other sample ids than step {step} schedules"
                    )
            while slot.error is None and len(slot.messages) < len(self.senders):
                if not slot.full.wait(timeout=max(0.0, deadline - time.monotonic())):
                    missing = [s for s in self.senders if s not in slot.messages]
                    self._fail(slot, f"no {self.what} from {', '.join(missing)} within {timeout:.0f} s")
        if slot.error is not None:
            raise aborted(slot.error)
        return [slot.messages[s][1] for s in self.senders]

    def answer(self, step: int, replies: dict[str, R]) -> None:
        """Complete ``step``: each waiting sender returns its reply."""
        with self.lock:
            slot = self.slots.pop(step)
            slot.replies.update(replies)
            self.completed_step = step
            slot.done.set()

    def fail(self, step: int, error: str) -> None:
        """Fail ``step``: every sender waiting on it is answered ``aborted`` with ``error``."""
        with self.lock:
            slot = self.slots.get(step)
            if slot is not None:
                self._fail(slot, error)

    def stop(self, reason: str) -> None:
        """Fail every step under way, so a shutdown is not held up by a dead peer."""
        with self.lock:
            for slot in list(self.slots.values()):
                self._fail(slot, f"run is shutting down: {reason}")

    def _fail(self, slot: _Slot[M, R], error: str) -> None:
        with self.lock:
            slot.error = error
            slot.done.set()
            slot.full.notify()
            self.slots.pop(slot.step, None)
