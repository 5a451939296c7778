"""`vflnet attack NAME --trace FILE`: run an attack offline over a recorded wire trace.

Same attack class, same events as online (the trace holds what the host party's tap saw), so the
output is the same as the online run's on the same traffic."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vflnet.interceptors.trace import read_trace
from vflnet.registry import ATTACKS
from vflnet.threat.attack import AttackContext


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    events = list(read_trace(args.trace))
    if not events:
        print(f"{args.trace}: no records")
        return 1
    party, run_id = events[0].party, events[0].run_id or ""
    cfg = None
    if args.config:
        from vflnet.validation import load_config

        cfg = load_config(args.config)
    role = args.role or (cfg.party(party).role if cfg else None)
    if role is None:
        print("give --role or --config (the host party's role)")
        return 2
    attack = ATTACKS.get(args.name)(AttackContext(party, role, run_id), **json.loads(args.params))
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
