"""The `vflnet` command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vflnet.config import Config, PartyConfig

ROLES = ("coordinator", "active", "passive")

# Subcommands implemented by a module with its own `build_parser()` and `main(argv)`.
_MODULE_COMMANDS = {
    "certs": ("vflnet.wire.certs_cli", "make a CA and per-party certificates for mutual TLS"),
    "health": ("vflnet.wire.healthcheck", "gRPC health check of a running party (exit 0 when SERVING)"),
    "proxy": ("vflnet.roles.proxy", "man-in-the-middle proxy between parties (taps, rewrites, TCP relay)"),
    "trace": ("vflnet.interceptors.trace_cli", "list, show and export wire traces"),
    "attack": ("vflnet.runner.offline", "run an attack offline over a recorded trace"),
    "reproduce": ("vflnet.tools.reproduce.cli", "paper reproductions whose results docs/attacks.md reports"),
    "lab": ("vflnet.tools.lab.cli", "multi-host network lab in Linux network namespaces (root)"),
    "sweep": (
        "vflnet.tools.experiments.sweep",
        "run a sweep file's runs (grid/zip, seeds) and tabulate them",
    ),
    "report": (
        "vflnet.tools.experiments.report",
        "Markdown and self-contained HTML report of a run or a sweep",
    ),
    "compare": (
        "vflnet.tools.experiments.compare",
        "two runs or two sweeps side by side (Markdown and HTML)",
    ),
}

# Subcommands that list a registry (vflnet.registry): command -> (registry, help).
_LISTS = {
    "datasets": ("DATASETS", "list the registered datasets (no downloads) and their parameters"),
    "models": ("MODELS", "list the registered model kinds (`kind:` of a bottom or top model block)"),
    "attacks": ("ATTACKS", "list the registered attacks and their parameters"),
    "defenses": ("DEFENSES", "list the registered defenses and their parameters"),
}


def command_module(name: str) -> ModuleType | None:
    """The module that parses and runs subcommand ``name`` itself (its ``build_parser`` and ``main``),
    or None for a subcommand of this module's parser."""
    return importlib.import_module(_MODULE_COMMANDS[name][0]) if name in _MODULE_COMMANDS else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet", description="Vertical federated learning over a real wire: attacks and defenses."
    )
    parser.add_argument("--version", action="version", version=f"vflnet {version('vflnet')}")
    sub = parser.add_subparsers(dest="command", required=True)

    text = "run a local cluster (one process per party) from a config"
    p = sub.add_parser(
        "run",
        help=text,
        description=f"{text}; prints a progress bar, then a summary table, and writes runs/<run-id>/ "
        "(its config.yaml is the resolved config, overrides included)",
    )
    p.add_argument("config", type=Path, nargs="?", help="the run config (not with --resume)")
    _add_overrides(p)
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue an interrupted run from its newest checkpoint (its config.yaml, same directory)",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="run directory (default: <run.dir>/<run.id>)")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (VFLNET_QUIET=1 does the same)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="limit on the whole run: past it every process is stopped and the exit code is 124",
    )
    add_start_argument(p)

    text = "start one role's process (how docker-compose and lab machines start parties)"
    p = sub.add_parser(
        "party",
        help=text,
        description=f"{text}: it serves gRPC on --listen and joins the coordinator; every party of a run "
        "is started with the same config and run.id",
    )
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--name", required=True, help="this party's name in the config roster")
    p.add_argument("--run-dir", type=Path, default=None, help="default: <run.dir>/<run.id>")
    p.add_argument("--listen", default=None, help="host:port to serve on (default: the roster address)")
    p.add_argument("--coordinator", default=None, help="coordinator host:port (default: its roster address)")
    p.add_argument(
        "--advertise",
        default=os.environ.get("VFLNET_ADVERTISE") or None,
        help="host:port other parties use to reach this one (default: $VFLNET_ADVERTISE, else the roster address)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        default=os.environ.get("VFLNET_RESUME", "") not in ("", "0"),
        help="continue from the checkpoint the coordinator names; every role of the run restarts with it "
        "(default: set when $VFLNET_RESUME is 1)",
    )

    p = sub.add_parser(
        "config", help="config tools", description="config tools: check a config, write its docs"
    )
    csub = p.add_subparsers(dest="config_command", required=True)
    text = "validate a config file (with any KEY=VALUE overrides) and exit"
    c = csub.add_parser("check", help=text, description=text)
    c.add_argument("file", type=Path)
    _add_overrides(c)
    text = "write docs/config.md from the schema (--check: only compare)"
    csub.add_parser(
        "docs",
        help=text,
        description=text,
        add_help=False,
        parents=[importlib.import_module("vflnet.docs_config").build_parser()],
    )

    for name, (_, help_text) in _LISTS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    text = "copy the example configs (and sweep files) shipped with vflnet into a folder"
    p = sub.add_parser("examples", help=text, description=f"{text}; never overwrites a file")
    p.add_argument(
        "dir", type=Path, nargs="?", default=Path("vflnet-examples"), help="default: ./vflnet-examples"
    )
    for name, (_, help_text) in _MODULE_COMMANDS.items():
        # listed only: main() hands these their arguments before this parser runs, so their modules
        # (matplotlib, scipy, ...) are not imported by every party process at start
        sub.add_parser(name, add_help=False, help=help_text)

    from vflnet.tools.bench import BENCHMARKS  # here, not at the top: `vflnet health` imports this module

    text = "benchmarks that print figures side by side"
    measures = "\n".join(f"  {name:<24}{what}" for name, (_, what) in BENCHMARKS.items())
    p = sub.add_parser(
        "bench",
        help=text,
        description=f"{text}; no name (or all): every one, into one JSON and one Markdown file (--smoke: "
        f"tiny sizes, --out DIR).\n\nwhat each measures:\n{measures}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", nargs="?", default="all", choices=[*BENCHMARKS, "all"], help="a benchmark (below)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's flags (NAME --help)")
    return parser


def add_start_argument(parser: argparse.ArgumentParser) -> None:
    """``--start``: how a run's role processes start (vflnet/runner/warm.py)."""
    parser.add_argument(
        "--start",
        choices=("warm", "cold"),
        default=os.environ.get("VFLNET_START") or "warm",
        help="warm: forked from one interpreter that has torch and vflnet imported (a fork server); "
        "cold: each a new `python -m vflnet party` (default: $VFLNET_START, else warm)",
    )


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="set a config key (dotted; a list index as .N or [N], from 0) to a YAML value, e.g. "
        "train.epochs=3 parties.2.bottom.hidden=[32] (docs/config.md)",
    )


def _cmd_party(args: argparse.Namespace) -> int:
    from vflnet.config import ConfigError
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
    from vflnet.roles.run_lock import role_lock

    with role_lock(run_dir, args.name):
        return _run_role(args, cfg, me, run_dir)


def _run_role(args: argparse.Namespace, cfg: Config, me: PartyConfig, run_dir: Path) -> int:
    from vflnet.config import ConfigError
    from vflnet.roles.common import setup_logging, setup_torch

    setup_logging(args.name, cfg.runtime.log_level)
    setup_torch(cfg)
    listen = args.listen or me.address or "127.0.0.1:0"
    from vflnet.sdk.bridge import GrpcBridge

    bridge = GrpcBridge(cfg.transport)  # a party process always talks real gRPC
    if args.role == "coordinator":
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
    from vflnet.roles.party import PartyHost, serve

    return serve(PartyHost(cfg, args.name, run_dir, bridge, resume=args.resume), listen, coord, advertise)


def main(argv: list[str] | None = None) -> int:
    from vflnet.runner.parent_death import die_with_parent_if_asked

    die_with_parent_if_asked()  # a launcher's child never outlives it
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except ImportError as exc:
        from vflnet.extras import MissingExtra  # here: the health check imports this module, and little

        if not isinstance(exc, MissingExtra):
            raise
        print(f"error: {exc}", file=sys.stderr)  # an optional dependency (an extra) is not installed
        return 2


def _main(argv: list[str]) -> int:
    module = command_module(argv[0]) if argv else None
    if module is not None:  # these parse their own arguments (some pass extras through)
        rc = module.main(argv[1:])
        return 0 if rc is None else int(rc)
    if argv[:1] == ["bench"] and (
        len(argv) == 1 or argv[1].startswith("-") and argv[1] not in ("-h", "--help")
    ):
        argv = ["bench", "all", *argv[1:]]  # `vflnet bench --smoke`: flags of `all`, not a benchmark's name
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "overrides", None) is not None and not any(a.startswith("-") for a in extra):
        args.overrides += extra  # KEY=VALUE after an option: argparse takes one run of positionals only
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from vflnet.config import ConfigError
    from vflnet.roles.run_lock import RunDirInUse
    from vflnet.wire.channels import BindError, PlaintextRefused

    try:
        if args.command == "run":
            from vflnet.runner.local import resume_local, run_local

            if (args.config is None) == (args.resume is None):
                print("vflnet run: give a config, or --resume RUN_DIR (not both)", file=sys.stderr)
                return 2
            if args.resume is not None:
                if args.overrides:
                    print(
                        "vflnet run --resume: a resumed run keeps its config (no KEY=VALUE)", file=sys.stderr
                    )
                    return 2
                return resume_local(
                    args.resume, progress=not args.no_progress, timeout_s=args.timeout, start=args.start
                )
            return run_local(
                args.config,
                run_dir=args.run_dir,
                progress=not args.no_progress,
                timeout_s=args.timeout,
                overrides=args.overrides,
                start=args.start,
            )
        if args.command == "party":
            return _cmd_party(args)
        if args.command == "config" and args.config_command == "docs":
            from vflnet.docs_config import main as docs_main

            return docs_main(argv[2:])
        if args.command == "config":
            from vflnet.validation import load_config

            cfg = load_config(args.file, overrides=args.overrides)
            print(
                f"{args.file}: OK ({len(cfg.parties)} parties, protocol {cfg.protocol.kind}, dataset {cfg.data.dataset})"
            )
            return 0
        if args.command in _LISTS:
            from vflnet import registry

            print(registry.describe(getattr(registry, _LISTS[args.command][0])))
            return 0
        if args.command == "examples":
            from vflnet.example_configs import copy_examples

            return copy_examples(args.dir)
        if args.command == "bench":
            from vflnet.tools.bench import BENCHMARKS

            module = "vflnet.tools.bench.suite" if args.what == "all" else BENCHMARKS[args.what][0]
            return int(importlib.import_module(module).main(args.args) or 0)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except RunDirInUse as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BindError, PlaintextRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1
