"""A party's steps run one at a time and in order when the coordinator keeps several commands out."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from vflnet.roles.step_order import STEPS_IN_FLIGHT, StepTurns
from vflnet.wire.errors import RpcFailure

WAIT_S = 30  # a generous bound: the waits below end by an event, not by this


def _waiter(turns: StepTurns, step: int, timeout: float = WAIT_S) -> tuple[threading.Thread, dict]:
    out: dict = {}
    started = threading.Event()

    def run() -> None:
        started.set()
        try:
            turns.wait(step, timeout)
            out["ok"] = True
        except RpcFailure as exc:
            out["error"] = (exc.code, exc.message)

    thread = threading.Thread(target=run)
    thread.start()
    started.wait(WAIT_S)
    return thread, out


def _until_waiting(turns: StepTurns, step: int) -> None:
    with turns.cond:
        assert turns.cond.wait_for(lambda: step in turns.waiting, WAIT_S)


def test_the_next_step_and_a_retried_one_go_at_once_and_one_too_far_ahead_is_refused():
    turns = StepTurns()
    turns.wait(1, 0)  # the next step
    turns.complete(1)
    turns.wait(1, 0)  # a finished step: the host answers a retry from its stored report or refuses it
    with pytest.raises(RpcFailure) as info:
        turns.wait(1 + STEPS_IN_FLIGHT + 1, 0)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "out of order" in info.value.message and "2 is next" in info.value.message
    assert turns.waiting == set()


def test_the_step_after_the_next_waits_for_it_and_a_second_copy_is_refused():
    turns = StepTurns()
    thread, out = _waiter(turns, 2)
    _until_waiting(turns, 2)
    with pytest.raises(RpcFailure) as info:  # nothing can park a second thread on the same step
        turns.wait(2, 0)
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert out == {}  # still waiting for step 1
    turns.complete(1)
    thread.join(WAIT_S)
    assert out == {"ok": True} and turns.waiting == set()


@pytest.mark.parametrize("end", ["fail", "stop"])
def test_a_waiting_step_is_refused_when_the_step_before_it_fails_or_the_party_stops(end):
    turns = StepTurns()
    thread, out = _waiter(turns, 2)
    _until_waiting(turns, 2)
    turns.fail() if end == "fail" else turns.stop("test")
    thread.join(WAIT_S)
    assert out["error"][0] == grpc.StatusCode.ABORTED
    assert ("step 1 failed" if end == "fail" else "stopping: test") in out["error"][1]


def test_a_waiting_step_gives_up_at_its_deadline():
    turns = StepTurns()
    thread, out = _waiter(turns, 2, timeout=0.05)
    thread.join(WAIT_S)
    assert out["error"][0] == grpc.StatusCode.DEADLINE_EXCEEDED and "for step 1" in out["error"][1]
    assert turns.waiting == set() and turns.done == 0


def test_every_step_in_the_window_waits_its_turn_and_a_failure_refuses_each():
    """With STEPS_IN_FLIGHT commands out, every one after the next waits, in order; the step in
    progress failing refuses all of them, naming it."""
    assert STEPS_IN_FLIGHT >= 3
    turns = StepTurns()
    waiters = [_waiter(turns, step) for step in range(2, STEPS_IN_FLIGHT + 1)]
    for step in range(2, STEPS_IN_FLIGHT + 1):
        _until_waiting(turns, step)
    turns.complete(1)
    waiters[0][0].join(WAIT_S)
    assert waiters[0][1] == {"ok": True}  # step 2's turn; step 3 still waits for it
    assert all(out == {} for _, out in waiters[1:])
    turns.fail()  # step 2 fails here
    for thread, out in waiters[1:]:
        thread.join(WAIT_S)
        assert out["error"][0] == grpc.StatusCode.ABORTED and "step 2 failed" in out["error"][1]


def test_a_waiting_step_gets_the_deadline_once_for_each_step_before_it():
    turns = StepTurns()
    thread, out = _waiter(turns, 3, timeout=2.0)  # steps 1 and 2 run first: 4 s
    _until_waiting(turns, 3)
    time.sleep(2.5)
    assert out == {}  # past one deadline, within two
    thread.join(WAIT_S)
    assert out["error"][0] == grpc.StatusCode.DEADLINE_EXCEEDED and "for step 2" in out["error"][1]
