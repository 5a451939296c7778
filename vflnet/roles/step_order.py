"""The order of a party's steps when the coordinator keeps more than one step command out.

The coordinator sends step n+1's RunStep before step n's reports are in (``STEPS_IN_FLIGHT``,
vflnet/roles/coordinator.py), so that its delivery overlaps step n's work instead of adding to it.
The command reaches a party while it still works on step n, and may even overtake step n's command
(two calls are two HTTP/2 streams, served by different threads). A party still runs its steps one
at a time and strictly in order: the command for the step after the next waits here for its turn,
bounded by the step deadline; a command further ahead, or a second one for the same waiting step,
is refused at once and changes nothing, so no sender can park the party.
"""

from __future__ import annotations

import threading

import grpc

from vflnet.wire.errors import RpcFailure

STEPS_IN_FLIGHT = 2  # step commands a pipelined schedule keeps out at once (this one and the next)


class StepTurns:
    """The last step this party completed, and the commands waiting for their turn."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done = 0  # the last step this party completed (steps are numbered 1, 2, ... across phases)
        self.failures = 0  # steps that failed here: a command waiting on one stops waiting
        self.stopped: str | None = None
        self.waiting: set[int] = set()

    def wait(self, step: int, timeout: float) -> None:
        """Return when ``step`` is next (or already done: the caller answers a retry or refuses it as
        stale); refuse it if it is too far ahead, if the step before it fails or the party stops."""
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
            self.cond.notify_all()  # whoever watches ``waiting`` (a health view, a test) sees it at once
            failures = self.failures
            try:
                turn = self.cond.wait_for(
                    lambda: step <= self.done + 1 or self.failures > failures or self.stopped is not None,
                    timeout,
                )
            finally:
                self.waiting.discard(step)
            if self.stopped is not None:
                raise RpcFailure(
                    grpc.StatusCode.ABORTED, f"step {step}: the party is stopping: {self.stopped}"
                )
            if step <= self.done + 1:
                return
            if self.failures > failures:
                raise RpcFailure(
                    grpc.StatusCode.ABORTED, f"step {step}: step {step - 1} failed at this party"
                )
            assert not turn
            raise RpcFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"step {step} waited {timeout:.0f} s for step {step - 1} to complete",
            )

    def complete(self, step: int) -> None:
        with self.cond:
            self.done = step
            self.cond.notify_all()

    def fail(self) -> None:
        """The step in progress failed: the command waiting for it is refused (the run is ending)."""
        with self.cond:
            self.failures += 1
            self.cond.notify_all()

    def stop(self, why: str) -> None:
        with self.cond:
            self.stopped = why
            self.cond.notify_all()
