"""`vflnet attack NAME --trace FILE`: run an attack offline over a recorded wire trace.

Same attack class, same events as online (the trace holds what the host party's tap saw), so the
output is the same as the online run's on the same traffic. A trace the attack cannot act on is
refused (one line, exit code 2): unreadable, of a party at another role than the attack's position,
or holding no message the attack taps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vflnet.interceptors.events import WireEvent
from vflnet.interceptors.trace import TraceError, read_trace
from vflnet.registry import ATTACKS
from vflnet.threat.attack import Attack, AttackContext


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflnet attack", description=__doc__)
    parser.add_argument("name", help="attack name (see `vflnet attacks`)")
    parser.add_argument(
        "--trace", type=Path, required=True, help="trace file of the party that hosts the attack"
    )
    parser.add_argument(
        "--role",
        choices=["coordinator", "active", "passive"],
        help="host party's role (default: from --config)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="the run's config: gives the role, and scores the output against ground truth",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="the run's directory, for scores that need the run's outputs (backdoor: "
        "the active party's test predictions); default: the trace's run (<run>/traces/PARTY.trace)",
    )
    parser.add_argument("--params", default="{}", help="attack parameters as JSON")
    parser.add_argument("--out", type=Path, help="write the output arrays to this .npz")
    return parser


class Refused(TraceError):
    """A trace the attack cannot act on, or cannot read: `vflnet` prints it as one line, exit code 2."""


def trace_role(events: list[WireEvent]) -> str | None:
    """The role of the party that wrote a trace, from its admission: a party sends its Join request
    (with its role), the coordinator serves it; None if the trace holds no Join."""
    for event in events:
        if event.short_method == "Join" and event.direction == "request":
            return "coordinator" if event.side == "server" else event.message.role
    return None


def _read(path: Path) -> list[WireEvent]:
    try:
        return list(read_trace(path))
    except OSError as exc:  # a TraceError (not a trace, a newer format, a partial one) says it itself
        raise Refused(f"cannot read the trace {path}: {exc.strerror or exc}") from exc


def _check_position(
    attack_cls: type[Attack], path: Path, events: list[WireEvent], party: str, role: str
) -> None:
    """The trace is of a party at ``role``, and some message of it is one the attack taps."""
    written_by = trace_role(events)
    if written_by is not None and written_by != role:
        raise Refused(
            f"{path} is the trace of {party} (a {written_by} party); attack {attack_cls.name!r} at "
            f"--role {role} needs the trace of a {role} party"
        )
    if not attack_cls.taps:
        raise Refused(
            f"attack {attack_cls.name!r} taps no message (it acts on its party's own view, data or "
            "predictions): it cannot run over a trace"
        )
    if not any(t.matches(e) for e in events for t in attack_cls.taps):
        taps = ", ".join(f"{t.method} {t.direction} at the {t.side}" for t in attack_cls.taps)
        raise Refused(
            f"{path}: no message of {party}'s trace matches the taps of {attack_cls.name!r} ({taps}): "
            "it would act on nothing"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    events = _read(args.trace)
    if not events:
        print(f"{args.trace}: no records")
        return 1
    party, run_id = events[0].party, events[0].run_id or ""
    cfg = None
    if args.config:
        from vflnet.validation import load_config

        cfg = load_config(args.config)
        if party not in {p.name for p in cfg.parties}:
            raise Refused(f"{args.trace} is the trace of {party}, who is not in {args.config}'s roster")
    role = args.role or (cfg.party(party).role if cfg else None)
    if role is None:
        print("give --role or --config (the host party's role)")
        return 2
    if cfg is not None and cfg.party(party).role != role:
        raise Refused(
            f"{args.trace} is the trace of {party}, a {cfg.party(party).role} party in {args.config}"
        )
    try:
        attack_cls = ATTACKS.get(args.name)
    except KeyError as exc:
        raise Refused(str(exc)) from exc
    if role not in attack_cls.roles:
        raise Refused(f"attack {args.name!r} sits at {sorted(attack_cls.roles)}, not at a {role} party")
    _check_position(attack_cls, args.trace, events, party, role)
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        raise Refused(f"--params is not JSON: {exc}") from exc
    try:
        attack = attack_cls(AttackContext(party, role, run_id), **params)
    except ValueError as exc:  # a bad parameter
        raise Refused(str(exc)) from exc
    if cfg is not None:  # what the threat model grants, as online (e.g. the few labels an attacker knows)
        from vflnet.threat.knowledge import threat_model_knowledge

        attack.context.knowledge.update(threat_model_knowledge(cfg, party, attack))
    output = attack.run(events)
    for key, value in output.items():
        print(f"{key}: shape {np.shape(value)}")
    if args.out:
        np.savez(args.out, **output)
        print(f"wrote {args.out}")
    if cfg is not None:
        from vflnet.runner.scoring import score_output

        run_dir = args.run_dir or args.trace.resolve().parent.parent
        try:
            scores = score_output(cfg, args.name, output, run_dir)
        except FileNotFoundError as exc:
            print(f"cannot score {args.name}: {exc}; give --run-dir")
            return 2
        for key, value in scores.items():
            print(f"score {key}: {value}")
    return 0
