"""A party's interceptor chain, from config: its trace tap first, then its attacks in config order.

The same chain sits on the party's gRPC server and on every client channel it opens, so a mod
sees everything that crosses this party's wire, in both directions, and nothing else."""

from __future__ import annotations

import json
import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from time import time as _now
from typing import Any

import numpy as np
from google.protobuf.message import Message

from vflnet.config import Config, ConfigError, PluginConfig
from vflnet.interceptors.chain import Chain, Recorder
from vflnet.interceptors.events import WireEvent, header_of
from vflnet.interceptors.trace import TraceWriter, entries_after, record_to_event, trace_path
from vflnet.registry import ATTACKS, load_plugin_modules
from vflnet.threat.attack import Attack, AttackContext, OwnStepView, PredictionView
from vflnet.threat.effects import Effects, entry_key, register
from vflnet.threat.knowledge import threat_model_knowledge
from vflnet.v1 import messages_pb2

log = logging.getLogger(__name__)

# `vflnet bench goals` times the trace tap inside one run: every party of the run it starts reads this
# (a number of steps; see Chain's step_blocks). A benchmark's setting: its traces leave half the steps out
TAP_BLOCKS_ENV = "VFLNET_BENCH_TAP_BLOCKS"


@dataclass
class PartyInterception:
    party: str
    chain: Chain
    attacks: list[tuple[PluginConfig, Attack]] = field(default_factory=list)
    trace: TraceWriter | None = None
    knowledge: dict[str, Any] = field(default_factory=dict)  # filled by the protocol, e.g. the public key
    effects: Effects | None = None  # what its attacks and defenses did (vflnet/threat/effects.py)
    finished: list[Path] | None = None  # the outputs ``finish`` wrote (it runs once)

    def _count(self, entry: PluginConfig, what: str, n: int = 1) -> None:
        if self.effects is not None:
            self.effects.count(entry_key(entry.name, entry.party), what, n)

    @property
    def wants_own_view(self) -> bool:
        return any(a.wants_own_view for _, a in self.attacks)

    def deliver_own_view(self, view: OwnStepView) -> None:
        for entry, attack in self.attacks:
            if attack.wants_own_view:
                attack.observe_own(view)
                self._count(entry, "own_views")

    def deliver_predictions(self, view: PredictionView) -> None:
        """A prediction step's released confidence vectors, to every attack granted ``predictions``."""
        for entry, attack in self.attacks:
            if "predictions" in attack.knowledge:
                attack.observe_predictions(view)
                self._count(entry, "prediction_views")

    def own_data(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The party's feature rows after every attack that rewrites its own data (backdoor trigger)."""
        for entry, attack in self.attacks:
            if attack.changes_own_data:
                before, x = x, attack.own_data(ids, x)
                self._count(entry, "own_rows", changed_rows(before, x))
        return x

    def state(self) -> dict[str, Any]:
        """For a coordinated checkpoint: each attack's state, the released models received, and the
        trace's length (a resumed run cuts the trace back to it, so no message appears twice)."""
        return {
            "attacks": [_picklable_state(entry.name, attack) for entry, attack in self.attacks],
            "released_model": self.knowledge.get("released_model"),
            "trace": self.trace.extent(sync=True) if self.trace is not None else None,
            "effects": self.effects.state() if self.effects is not None else None,
        }

    def load_state(self, state: dict[str, Any], step: int) -> None:
        """Back to the checkpoint of ``step``: the attacks' state, the released models, and the trace
        cut back to the end of that step (``_with_the_step_end``)."""
        for (entry, attack), saved in zip(self.attacks, state["attacks"], strict=True):
            if saved is None:
                log.warning("attack %s restarts with no state of the steps before the checkpoint", entry.name)
            else:
                attack.load_state(saved)
        if state["released_model"] is not None:
            self.knowledge["released_model"] = state["released_model"]
        if self.effects is not None:
            self.effects.load_state(state.get("effects"))  # checkpoints written before it have none
        if self.trace is not None and state["trace"] is not None:
            self.trace.cut(*_with_the_step_end(self.trace, *state["trace"], step))

    def start_over(self) -> None:
        """A resumed run with no checkpoint starts from its first step again: the trace keeps only
        this session's entries (its header, the party's admission), so no step appears twice."""
        if self.trace is not None:
            self.trace.cut(0, 0)

    def finish(self, run_dir: Path) -> list[Path]:
        """Write every attack's output (and close the trace): called when the party shuts down (once;
        a second call returns what the first wrote)."""
        if self.finished is not None:
            return self.finished
        written = []
        for entry, attack in self.attacks:
            output = attack.output()
            if self.effects is not None:
                self.effects.output_samples(entry_key(entry.name, entry.party), output)
            written.append(save_attack_output(run_dir, entry, output, sorted(self.knowledge)))
        if self.trace is not None:
            self.trace.close()
        self.finished = written
        return written

    def effects_report(self) -> dict[str, Any]:
        """What this party's attacks and defenses did (after ``finish``: with their outputs' samples)."""
        return self.effects.report() if self.effects is not None else {}


def changed_rows(before: np.ndarray, after: np.ndarray) -> int:
    """How many rows of a party's own data an attack changed."""
    if before.shape != after.shape:
        return int(len(after))
    differ = before != after
    return int(differ.reshape(len(differ), -1).any(axis=1).sum()) if differ.ndim > 1 else int(differ.sum())


class CountedAttack:
    """An attack as a mod of its party's chain, counted by the host: each message it taps, each
    message it rewrites (the attack returned a message to send instead)."""

    def __init__(self, attack: Attack, key: str, effects: Effects) -> None:
        self.attack, self.key, self.effects = attack, key, effects

    def __call__(self, event: WireEvent) -> Message | None:
        out = self.attack(event)
        if any(t.matches(event) for t in self.attack.taps):
            self.effects.count(self.key, "tapped")
        if out is not None:
            self.effects.count(self.key, "rewritten")
        return out

    def __repr__(self) -> str:
        return repr(self.attack)


def _with_the_step_end(trace: TraceWriter, size: int, records: int, step: int) -> tuple[int, int]:
    """The checkpoint's trace length (``size`` bytes, ``records`` records) and the records of the
    checkpoint's training ``step`` after it: a party saves its checkpoint within the step, and what
    it answers after that (its reply to the step's command; the active party's replies to the
    passive parties' exchanges, on their own threads) is traced as it goes out. The resumed run
    starts at the next step, so these are not sent again."""
    for end, entry in entries_after(trace.path, size):
        if entry.WhichOneof("entry") != "record":
            break
        event = record_to_event(entry.record)
        if event.step != step or event.phase != messages_pb2.TRAIN:
            break
        size, records = end, records + 1
    return size, records


def _picklable_state(name: str, attack: Attack) -> dict[str, Any] | None:
    """An attack's checkpoint state, or None (with a warning) if it holds something that cannot be
    saved (a lock, an open file): the checkpoint must not fail the run."""
    state = attack.state()
    try:
        pickle.dumps(state)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        log.warning("attack %s: state not checkpointed (%s); a resumed run restarts it", name, exc)
        return None
    return state


def attack_output_path(run_dir: Path, entry: PluginConfig) -> Path:
    return run_dir / "attacks" / f"{entry.name}@{entry.party}.npz"


def save_attack_output(
    run_dir: Path, entry: PluginConfig, output: dict[str, np.ndarray], knowledge: list[str]
) -> Path:
    path = attack_output_path(run_dir, entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **output)
    meta = {
        "name": entry.name,
        "party": entry.party,
        "params": entry.params,
        "knowledge_delivered": knowledge,
        "arrays": {k: list(np.shape(v)) for k, v in output.items()},
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    return path


class RunTrace(Recorder):
    """A party's trace tap, minus what arrives from outside the run: a request at this party's server
    of another run, or from a name outside the roster, is counted and not recorded (a flood of garbage
    would otherwise fill the trace up to its cap). Everything the party itself sends and receives as a
    client, and every request of the run, is recorded as before."""

    def __init__(self, writer: TraceWriter, cfg: Config) -> None:
        self.writer, self.run_id = writer, cfg.run.id
        self.roster = {p.name for p in cfg.parties}
        self.left_out = 0

    def record(
        self,
        direction: str,
        side: str,
        method: str,
        party: str,
        peer: str,
        message: Message,
        data: bytes | None = None,
        time: float | None = None,
    ) -> None:
        if side == "server" and direction == "request":
            header = header_of(message)
            if header is not None:
                run_id, sender = header.run_id, header.sender
            else:  # Join and the like name the run and the sender themselves
                run_id = getattr(message, "run_id", None)
                sender = getattr(message, "sender", getattr(message, "name", None))
            if run_id != self.run_id or (sender is not None and sender not in self.roster):
                self.left_out += 1
                if self.left_out & (self.left_out - 1) == 0:  # 1, 2, 4, ...: never a log flood
                    log.warning(
                        "%s: %d requests from outside the run left out of the trace",
                        self.writer.party,
                        self.left_out,
                    )
                return None
        self.writer.write_record(
            direction, side, method, party, peer, message, data, _now() if time is None else time
        )


def party_interception(cfg: Config, name: str, run_dir: Path) -> PartyInterception:
    load_plugin_modules(cfg.plugins)
    role = cfg.party(name).role
    knowledge: dict[str, Any] = {}
    mods: list[Any] = []
    trace = None
    traced = name in cfg.trace.parties or "all" in cfg.trace.parties
    blocks = _party_tap_blocks(name, traced, [e.name for e in cfg.attacks if e.party == name])
    if traced:
        trace = TraceWriter(
            trace_path(run_dir, name),
            name,
            cfg.run.id,
            max_bytes=int(cfg.trace.max_mb * 1024 * 1024),
            step_blocks=blocks,
        )
        mods.append(RunTrace(trace, cfg))
    attacks = []
    effects = register(cfg, name)
    for entry in cfg.attacks:
        if entry.party == name:
            attack = ATTACKS.get(entry.name)(AttackContext(name, role, cfg.run.id, knowledge), **entry.params)
            knowledge.update(threat_model_knowledge(cfg, name, attack))
            attacks.append((entry, attack))
            key = entry_key(entry.name, name)
            effects.add_attack(key, attack)
            mods.append(CountedAttack(attack, key, effects))
            log.info(
                "%s hosts attack %s (%s)",
                name,
                entry.name,
                ", ".join(f"{k}={v}" for k, v in attack.p.items()),
            )
    return PartyInterception(name, Chain(mods, step_blocks=blocks), attacks, trace, knowledge, effects)


def bench_tap_blocks() -> int:
    """``TAP_BLOCKS_ENV``'s steps, 0 when it is unset. Read by every party; the launcher of a local
    run prints it too (a lab's or compose's parties say so in their logs and their traces' headers)."""
    value = os.environ.get(TAP_BLOCKS_ENV, "")
    if not value:
        return 0
    if not value.isdigit() or int(value) < 1:
        raise ConfigError("", TAP_BLOCKS_ENV, f"{value!r}: expected a number of steps, at least 1")
    return int(value)


def _party_tap_blocks(party: str, traced: bool, attacks: list[str]) -> int:
    """``TAP_BLOCKS_ENV``'s steps for this party: 0 when it is unset or the party has no trace tap.
    Refused beside an attack: the attack would miss every other block of steps. Its trace's header
    says so, and reading it for an attack or a score is refused (``read_trace``)."""
    blocks = bench_tap_blocks()
    if not blocks or not traced:
        return 0
    if attacks:
        names = ", ".join(attacks)
        raise ConfigError(
            "",
            TAP_BLOCKS_ENV,
            f"a benchmark's A/B of the trace tap would hide every other block of steps from {party}'s "
            f"attacks ({names}); unset it",
        )
    log.warning(
        "%s: %s=%s: the trace tap sees the steps of even blocks of %s only (a benchmark's A/B); "
        "the trace leaves the others out",
        party,
        TAP_BLOCKS_ENV,
        blocks,
        blocks,
    )
    return blocks
