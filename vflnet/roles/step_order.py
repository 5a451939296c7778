"""The order of a party's steps when the coordinator keeps more than one step command out.

The coordinator sends step n+1's and step n+2's RunStep before step n's reports are in
(``STEPS_IN_FLIGHT``, vflnet/roles/coordinator.py), so that their delivery overlaps step n's work
instead of adding to it. A command reaches a party while it still works on an earlier step, and may
even overtake the command before it (two calls are two HTTP/2 streams, served by different threads).
A party still runs its steps one at a time and strictly in order: a command for a later step than
the next waits here for its turn, bounded by the step deadline for each step before it; a command
further ahead than the window, or a second one for the same waiting step, is refused at once and
changes nothing, so no sender can park the party.

Why three: a step's critical path is one passive-active round trip (embeddings up, gradients down)
plus compute. The coordinator's own loop per step command is a round trip too (step n's report in,
step n+STEPS_IN_FLIGHT's command out), so with two commands out that loop tied with the step itself
and any coordinator or scheduling delay could add to a step (issue 40: in the network lab with 1 KB
embeddings at 50 ms one-way delay, the next RunStep reached a passive party after it had finished the
step before in 17-24 of 66 steps). With three out, the coordinator's round trip is spread over two
steps (0 of 66).
"""

from __future__ import annotations

import threading

import grpc

from vflnet.wire.errors import RpcFailure

STEPS_IN_FLIGHT = 3  # step commands a pipelined schedule keeps out at once (this one and the next two)


class StepTurns:
    """The last step this party completed, and the commands waiting for their turn.

    Each waiting command has a condition of its own on the shared lock, so a completed step wakes
    only the command whose turn it is (with three out, a shared condition would also wake the one
    behind it, each step, for nothing); a failure or a stop wakes them all."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # of everything here; the conditions of the waiting steps share it
        self.cond = threading.Condition(self._lock)  # notified when ``waiting`` grows
        self.done = 0  # the last step this party completed (steps are numbered 1, 2, ... across phases)
        self.failures = 0  # steps that failed here: a command waiting on one stops waiting
        self.stopped: str | None = None
        self.waiting: set[int] = set()
        self._turns: dict[int, threading.Condition] = {}  # a waiting step -> its own condition

    def wait(self, step: int, timeout: float) -> None:
        """Return when ``step`` is next (or already done: the caller answers a retry or refuses it as
        stale); refuse it if it is too far ahead, if a step before it fails or the party stops, or
        if it waited ``timeout`` for each step before it (they run one after the other)."""
        with self.cond:
            if step <= self.done + 1:
                return
            if step > self.done + STEPS_IN_FLIGHT:
                raise RpcFailure(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"step {step} is out of order: step {self.done} is done, {self.done + 1} is next",
                )
            if step in self.waiting:
                raise RpcFailure(
                    grpc.StatusCode.ALREADY_EXISTS, f"step {step} is already waiting for its turn"
                )
            self.waiting.add(step)
            self._turns[step] = mine = threading.Condition(self._lock)
            self.cond.notify_all()  # whoever watches ``waiting`` (a health view, a test) sees it at once
            failures = self.failures
            ahead = step - self.done - 1  # steps that run here before this one
            try:
                turn = mine.wait_for(
                    lambda: step <= self.done + 1 or self.failures > failures or self.stopped is not None,
                    timeout * ahead,
                )
            finally:
                self.waiting.discard(step)
                del self._turns[step]
            if self.stopped is not None:
                raise RpcFailure(
                    grpc.StatusCode.ABORTED, f"step {step}: the party is stopping: {self.stopped}"
                )
            if step <= self.done + 1:
                return
            if self.failures > failures:
                raise RpcFailure(
                    grpc.StatusCode.ABORTED, f"step {step}: step {self.done + 1} failed at this party"
                )
            assert not turn
            raise RpcFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"step {step} waited {timeout * ahead:.0f} s for step {step - 1} to complete",
            )

    def complete(self, step: int) -> None:
        with self.cond:
            self.done = step
            for waiting, turn in self._turns.items():
                if waiting <= step + 1:  # the next one (a restored party may jump ahead)
                    turn.notify()

    def _wake_all(self) -> None:
        for turn in self._turns.values():
            turn.notify()

    def fail(self) -> None:
        """The step in progress failed: the command waiting for it is refused (the run is ending)."""
        with self.cond:
            self.failures += 1
            self._wake_all()

    def stop(self, why: str) -> None:
        with self.cond:
            self.stopped = why
            self._wake_all()
