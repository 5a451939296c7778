"""`vflnet party`: one role's process, as docker-compose and lab machines start parties."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from vflnet.config import ConfigError

if TYPE_CHECKING:
    from vflnet.config import Config, PartyConfig

ROLES = ("coordinator", "active", "passive")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet party",
        description="start one role's process (how docker-compose and lab machines start parties): it "
        "serves gRPC on --listen and joins the coordinator; every party of a run is started with the "
        "same config and run.id",
    )
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--name", required=True, help="this party's name in the config roster")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: <run.dir>/<run.id>")
    parser.add_argument("--listen", default=None, help="host:port to serve on (default: the roster address)")
    parser.add_argument(
        "--coordinator", default=None, help="coordinator host:port (default: its roster address)"
    )
    parser.add_argument(
        "--advertise",
        default=os.environ.get("VFLNET_ADVERTISE") or None,
        help="host:port other parties use to reach this one (default: $VFLNET_ADVERTISE, else the roster address)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        default=os.environ.get("VFLNET_RESUME", "") not in ("", "0"),
        help="continue from the checkpoint the coordinator names; every role of the run restarts with it "
        "(default: set when $VFLNET_RESUME is 1)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from vflnet.roles.run_lock import role_lock  # after parsing: `--help` imports no torch
    from vflnet.validation import load_config

    cfg = load_config(args.config, here=[args.name])  # the other parties' devices are on their machines
    try:
        me = cfg.party(args.name)
    except KeyError as exc:
        raise ConfigError(str(args.config), "parties", str(exc.args[0] if exc.args else exc)) from exc
    if me.role != args.role:
        raise ConfigError(
            str(args.config),
            "parties",
            f"party {args.name!r} has role {me.role!r} in the roster, not {args.role!r}",
        )
    if not cfg.run.id:
        raise ConfigError(
            str(args.config), "run.id", "required when parties are started one by one (all must agree on it)"
        )
    run_dir = args.run_dir or Path(cfg.run.dir) / cfg.run.id
    run_dir.mkdir(parents=True, exist_ok=True)
    with role_lock(run_dir, args.name):
        return _run_role(args, cfg, me, run_dir)


def _run_role(args: argparse.Namespace, cfg: Config, me: PartyConfig, run_dir: Path) -> int:
    from vflnet.interceptors.bridge import GrpcBridge
    from vflnet.roles.common import setup_logging, setup_torch

    setup_logging(args.name, cfg.runtime.log_level)
    setup_torch(cfg)
    listen = args.listen or me.address or "127.0.0.1:0"
    bridge = GrpcBridge(cfg.transport)  # a party process always talks real gRPC
    if args.role == "coordinator":  # each role imports its own host only
        from vflnet.roles import coordinator

        return coordinator.main(cfg, run_dir, listen, bridge, resume=args.resume)
    coord = args.coordinator or cfg.coordinator.address
    if not coord:
        raise ConfigError(
            str(args.config), "parties", "the coordinator has no address: give --coordinator HOST:PORT"
        )
    # `via: HOST:PORT`: peers reach this party through a proxy there (`via: proxy` is `vflnet run`'s own proxy)
    via = me.via if ":" in me.via else ""
    advertise = via or args.advertise or me.address or listen
    from vflnet.data.sources import SourceError
    from vflnet.roles.party import PartyHost, serve

    try:
        host = PartyHost(cfg, args.name, run_dir, bridge, resume=args.resume)
    except SourceError as exc:  # the party's own file: one line naming party, file and column
        logging.getLogger("vflnet.party").error("%s", exc)
        return 2
    return serve(host, listen, coord, advertise)
