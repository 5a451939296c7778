"""`vflnet lab up|run|impair|down`: a multi-host network lab from network namespaces (needs root)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflnet.config import ConfigError
from vflnet.subcommands import add_action, run_action

if TYPE_CHECKING:
    from vflnet.tools.lab.netlab import Lab

# `lab run` options a resumed run takes from its run directory instead
RECORDED_RUN_OPTIONS = (
    "tls",
    "via_proxy",
    "proxy_mode",
    "tamper",
    "proxy_arg",
    "prefix",
    "netem",
    "emulator",
    "proxy_host",
    "tcp_cc",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet lab",
        description="One network namespace per party on a private subnet (10.213.0.0/24), optional "
        "latency and loss, an optional proxy host on the path. Needs root.",
    )
    sub = parser.add_subparsers(dest="lab_command", required=True)
    _add_up(sub)
    _add_run(sub)
    _add_impair(sub)
    p = add_action(sub, "down", _down, "stop the lab's processes and delete its namespaces (idempotent)")
    p.add_argument("--prefix", default="vfl")
    return parser


def _impairment_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--netem",
        default="",
        metavar="SPEC",
        help="impairment on every host's egress, in tc-netem syntax, e.g. 'delay 100ms loss 1%%'",
    )
    p.add_argument(
        "--emulator",
        choices=["auto", "netem", "userspace"],
        default="auto",
        help="auto: kernel tc netem if the kernel has it, else the userspace hub; userspace: the hub "
        "always (delay, jitter, loss, rate; `lab impair` and --fault need it)",
    )
    p.add_argument("--proxy-host", action="store_true", help="add a host for `vflnet proxy`")
    p.add_argument(
        "--tcp-cc",
        default="",
        metavar="NAME",
        help="TCP congestion control of every host (e.g. reno; default: the machine's, which may pace "
        "messages of a few KB on a delayed link)",
    )


def _add_up(sub: argparse._SubParsersAction) -> None:
    p = add_action(sub, "up", _up, "create the namespaces and links for a config's roster")
    p.add_argument("config", type=Path)
    p.add_argument("--prefix", default="vfl", help="namespace name prefix; one lab per prefix (default vfl)")
    p.add_argument("--dir", type=Path, default=None, help="lab directory (default runs/lab-PREFIX)")
    _impairment_options(p)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = add_action(sub, "run", _run, "run the training job across the lab's hosts")
    p.add_argument(
        "target",
        type=Path,
        nargs="?",
        metavar="CONFIG|LABDIR",
        help="a lab directory from `lab up`, or a config: then the lab is brought up and down around the run",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        default=None,
        help="resume that lab run from its newest valid checkpoint, on its lab (brought up and down "
        "around it if it is not up), with the options it was started with",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="'step N: PARTY SETTING... [for DURATION]'",
        help="once metrics.jsonl records step N, set PARTY's link (down, up) or impairment "
        "(delay=, jitter=, loss=, rate=, clear) on the userspace hub, e.g. 'step 20: passive-1 down for 10s' "
        "(repeat for several)",
    )
    p.add_argument(
        "--tls", action="store_true", help="mutual TLS with fresh certificates naming the hosts' addresses"
    )
    p.add_argument(
        "--via-proxy",
        metavar="PARTY",
        default=None,
        help="start `vflnet proxy` on the proxy host in front of PARTY; peers reach PARTY through it",
    )
    p.add_argument(
        "--proxy-mode",
        choices=["grpc", "tcp"],
        default="grpc",
        help="grpc: the proxy decodes, traces and forwards calls; tcp: it relays bytes (default grpc)",
    )
    p.add_argument(
        "--tamper",
        action="store_true",
        help="the proxy also tampers: grpc zeroes the embeddings it relays, tcp flips one bit per connection",
    )
    p.add_argument(
        "--proxy-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the proxy (repeat for several; e.g. --proxy-arg=--tamper ...)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds the whole run may take (default 600)"
    )
    p.add_argument("--prefix", default="vfl", help="prefix for the lab made from a CONFIG (default vfl)")
    _impairment_options(p)


def _add_impair(sub: argparse._SubParsersAction) -> None:
    p = add_action(
        sub, "impair", _impair, "change a host's link or impairment now, on a running lab's userspace hub"
    )
    p.add_argument("party", help="a host of the lab (a party of the roster, or proxy)")
    p.add_argument(
        "settings",
        nargs="+",
        metavar="SETTING",
        help="down | up | clear | KEY=VALUE... with delay=TIME jitter=TIME loss=PERCENT%% rate=RATE "
        "(e.g. delay=20ms jitter=5ms loss=1%% rate=10mbit; the keys not given are none)",
    )
    p.add_argument("--prefix", default="vfl", help="the lab's prefix (default vfl)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.lab_command == "run" and (args.target is None) == (args.resume is None):
        parser.error("lab run: give CONFIG|LABDIR, or --resume RUN_DIR (one of them)")
    if args.lab_command == "run" and args.resume is not None:
        # the resumed run keeps its own transport, proxy and lab: an option here would change nothing
        defaults = vars(parser.parse_args(["run", "--resume", str(args.resume)]))
        for dest in RECORDED_RUN_OPTIONS:
            if getattr(args, dest) != defaults[dest]:
                parser.error(
                    f"lab run --resume: --{dest.replace('_', '-')} cannot be changed: the run resumes with "
                    "the options and the lab it was started with (RUN_DIR/lab-run.json, RUN_DIR/lab.json)"
                )
    from vflnet.roles.run_lock import RunDirInUse  # imports torch: not for `--help`
    from vflnet.tools.lab.netlab import LabError

    try:
        return run_action(args)
    except (LabError, ConfigError, RunDirInUse) as exc:
        print(f"vflnet lab: {exc}", file=sys.stderr)
        return 2


def _up(args: argparse.Namespace) -> int:
    from vflnet.tools.lab.netlab import up

    lab = up(args.config, lab_dir=args.dir, **_lab_options(args))
    _print_lab(lab)
    return 0


def _lab_options(args: argparse.Namespace) -> dict[str, Any]:
    """``up``'s options as `lab up` and `lab run` take them (_impairment_options, --prefix)."""
    return {
        "prefix": args.prefix,
        "netem": args.netem,
        "proxy_host": args.proxy_host,
        "emulator": args.emulator,
        "tcp_cc": args.tcp_cc,
    }


def _impair(args: argparse.Namespace) -> int:
    from vflnet.tools.lab.netlab import impair, running_lab

    lab = running_lab(args.prefix)
    impair(lab, args.party, args.settings)
    _print_impairments(lab)
    return 0


def _down(args: argparse.Namespace) -> int:
    from vflnet.tools.lab.netlab import down

    deleted = down(args.prefix)
    print(f"deleted {', '.join(deleted)}" if deleted else f"no lab with prefix {args.prefix!r} is up")
    return 0


def _run(args: argparse.Namespace) -> int:
    from vflnet.tools.lab.netlab import Lab, down, up
    from vflnet.tools.lab.run import resume_lab

    if args.resume is not None:
        return resume_lab(args.resume, timeout_s=args.timeout, faults=args.fault).rc
    if args.target.is_dir():
        return _run_on(Lab.open(args.target), args)
    options = _lab_options(args)
    if args.fault and args.emulator == "auto":  # a fault is set on the userspace hub: the lab has one
        options["emulator"] = "userspace"
    options["proxy_host"] = args.proxy_host or args.via_proxy is not None
    lab = up(args.target, **options)
    try:
        _print_lab(lab)
        return _run_on(lab, args)
    finally:
        down(lab.prefix)


def _run_on(lab: Lab, args: argparse.Namespace) -> int:
    from vflnet.tools.lab.run import run_lab

    proxy = {  # the proxy host's part
        "via": args.via_proxy,
        "proxy_mode": args.proxy_mode,
        "tamper": args.tamper,
        "proxy_args": args.proxy_arg,
    }
    return run_lab(lab, tls=args.tls, timeout_s=args.timeout, faults=args.fault, **proxy).rc


def _print_lab(lab: Lab) -> None:
    impair = f"{lab.netem} ({lab.emulator})" if lab.netem else "none"
    tcp = f", TCP congestion control {lab.tcp_cc}" if lab.tcp_cc else ""
    print(f"lab {lab.prefix!r} is up: {lab.lab_dir} (impairment: {impair}{tcp})")
    for h in lab.hosts:
        print(f"  {h.name:12s} {h.role:11s} netns {h.ns:20s} {h.endpoint}")
    print(
        f"config: {lab.config_path}\nrun it:  vflnet lab run {lab.lab_dir}\nremove:  vflnet lab down --prefix {lab.prefix}"
    )
    if lab.control:
        print(
            f"impair:  vflnet lab impair --prefix {lab.prefix} HOST down|up|clear|delay=20ms jitter=5ms ..."
        )


def _print_impairments(lab: Lab) -> None:
    from vflnet.tools.lab.netlab import impairments

    for name, state in impairments(lab).items():
        print(f"  {name:12s} {'up  ' if state['up'] else 'DOWN'} {state['impairment']}")
