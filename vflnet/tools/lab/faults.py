"""`vflnet lab run --fault 'step N: PARTY SETTING... [for DURATION]'`: faults injected mid-run.

A fault fires once the run's ``metrics.jsonl`` records training step N (the coordinator writes a
step's record when the step is done; the file is read every 0.05 s), so it hits a step after N,
whatever the machine's load did to the time it took to get there. It sets host PARTY's link
(``down``, ``up``) or impairment (``delay=20ms jitter=5ms loss=1% rate=10mbit``, ``clear``) on the
lab's userspace hub; with ``for DURATION`` the host's previous state comes back that long after.
What was done, and when, goes to the run's ``faults.jsonl``.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflnet.tools.lab.netlab import Lab, LabError, impair, impairments, require_hub
from vflnet.tools.lab.switch import Impairment, parse_impair, parse_time

POLL_S = 0.05
_FAULT = re.compile(r"^\s*step\s+(\d+)\s*:\s*(\S+)\s+(.*?)(?:\s+for\s+(\S+))?\s*$")


@dataclass(frozen=True)
class Fault:
    text: str
    step: int
    party: str
    settings: tuple[str, ...]
    for_s: float | None  # None: the setting stays after the run

    @property
    def link(self) -> bool:
        """Whether it sets the link state (down/up) rather than the impairment."""
        return not isinstance(parse_impair(list(self.settings)), Impairment)


def parse_fault(text: str, lab: Lab) -> Fault:
    """A ``--fault`` of ``lab``, or LabError naming what is wrong with it."""
    require_hub(lab)
    found = _FAULT.match(text)
    if found is None:
        raise LabError(
            f"--fault {text!r}: expected 'step N: PARTY SETTING... [for DURATION]', "
            "e.g. 'step 20: passive-1 down for 10s' or 'step 5: active delay=50ms jitter=10ms'"
        )
    step, party, settings, duration = found.groups()
    lab.host(party)
    try:
        parse_impair(settings.split())
        for_s = parse_time(duration) if duration is not None else None
    except ValueError as exc:
        raise LabError(f"--fault {text!r}: {exc}") from exc
    return Fault(text.strip(), int(step), party, tuple(settings.split()), for_s)


class FaultSchedule:
    """Follows ``run_dir/metrics.jsonl`` in a thread and applies each fault when its step is done."""

    def __init__(self, lab: Lab, faults: list[Fault], run_dir: Path) -> None:
        self.lab, self.run_dir = lab, run_dir
        self.pending = sorted(faults, key=lambda f: f.step)
        self.reverts: list[tuple[float, Fault, list[str]]] = []  # (when, fault, settings that undo it)
        self.problems: list[str] = []
        self.last_step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="lab-faults", daemon=True)

    def start(self) -> None:
        if self.pending:
            self._thread.start()

    def stop(self) -> list[str]:
        """Stop following; undo what a fault with a duration still holds (a fault ends with its run);
        print and return what went wrong, and each fault that never fired."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for _, fault, undo in self.reverts:
            self._apply(fault, undo, "undone at the run's end")
        self.reverts.clear()
        for fault in self.pending:
            self.problems.append(
                f"fault {fault.text!r} never fired: the run's last step was {self.last_step}"
            )
        self.pending.clear()
        for problem in self.problems:
            print(f"lab fault: {problem}", file=sys.stderr)
        return self.problems

    def _follow(self) -> None:
        metrics, offset = self.run_dir / "metrics.jsonl", 0
        while not self._stop.wait(POLL_S):
            try:
                size = metrics.stat().st_size
                if size < offset:  # a resumed run cut it back to its checkpoint
                    offset = 0
                with metrics.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            complete = data[: data.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                if record.get("kind") == "step":
                    self.last_step = max(self.last_step, int(record["step"]))
            while self.pending and self.pending[0].step <= self.last_step:
                self._fire(self.pending.pop(0))
            now = time.monotonic()
            for item in [r for r in self.reverts if r[0] <= now]:
                self.reverts.remove(item)
                self._apply(item[1], item[2], "its duration is over")

    def _fire(self, fault: Fault) -> None:
        undo: list[str] = []
        if fault.for_s is not None:
            try:
                before = impairments(self.lab)[fault.party]
            except LabError as exc:
                self.problems.append(f"fault {fault.text!r}: {exc}")
                return
            undo = ["up" if before["up"] else "down"] if fault.link else before["impairment"].split()
        if self._apply(fault, list(fault.settings), f"step {self.last_step} is done") and undo:
            assert fault.for_s is not None
            self.reverts.append((time.monotonic() + fault.for_s, fault, undo))

    def _apply(self, fault: Fault, settings: list[str], why: str) -> bool:
        try:
            state = impair(self.lab, fault.party, settings)
        except LabError as exc:
            self.problems.append(f"fault {fault.text!r}: {exc}")
            print(f"lab fault {fault.text!r} FAILED: {exc}", file=sys.stderr)
            return False
        record: dict[str, Any] = {
            "time": time.time(),
            "fault": fault.text,
            "party": fault.party,
            "set": " ".join(settings),
            "why": why,
            "state": state,
        }
        with (self.run_dir / "faults.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"lab fault: {fault.party} {' '.join(settings)} ({why})", file=sys.stderr, flush=True)
        return True
