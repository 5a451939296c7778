"""The `vflnet` command: :data:`COMMANDS`, one entry per subcommand (vflnet.subcommands.Command), each run
by a module of its own, listed by `vflnet --help` in its group (:data:`GROUPS`).

A command's module parses and runs its arguments (``build_parser()``, ``main(argv)`` with argv after
the command's name) and is imported only when the command runs: ``vflnet health`` runs every few
seconds in every container, and a party process should not import plotting. So this module imports
nothing of vflnet at the top but the table's type.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

from vflnet.subcommands import Command, listing

# `vflnet --help` lists the commands in these groups, in this order
GROUPS: dict[str, dict[str, Command]] = {
    "run a federation": {
        "run": Command("vflnet.commands.run", "run a local cluster (one process per party) from a config"),
        "party": Command(
            "vflnet.commands.party",
            "start one role's process (how docker-compose and lab machines start parties)",
        ),
        "config": Command("vflnet.commands.config", "config tools"),
        "data": Command(
            "vflnet.commands.data", "a party's own data: `split` a dataset into one file per party"
        ),
        "datasets": Command(
            "vflnet.commands.datasets", "list the registered datasets (no downloads) and their parameters"
        ),
        "models": Command(
            "vflnet.commands.models",
            "list the registered model kinds (`kind:` of a bottom or top model block)",
        ),
        "examples": Command(
            "vflnet.example_configs",
            "copy the example configs (and sweep files) shipped with vflnet into a folder",
        ),
        "warm": Command(
            "vflnet.commands.warm",
            "a resident fork server (torch imported) that later commands start from: start, stop, status",
        ),
    },
    "attack and audit": {
        "attacks": Command("vflnet.commands.attacks", "list the registered attacks and their parameters"),
        "defenses": Command("vflnet.commands.defenses", "list the registered defenses and their parameters"),
        "attack": Command("vflnet.runner.offline", "run an attack offline over a recorded trace"),
        "trace": Command("vflnet.interceptors.trace_cli", "list, show and export wire traces"),
        "proxy": Command(
            "vflnet.roles.proxy", "man-in-the-middle proxy between parties (taps, rewrites, TCP relay)"
        ),
        "audit": Command(
            "vflnet.tools.audit.cli", "which registered attacks apply to a run config, each run and scored"
        ),
    },
    "reproduce and benchmark": {
        "reproduce": Command(
            "vflnet.tools.reproduce.cli", "paper reproductions whose results docs/attacks.md reports"
        ),
        "bench": Command("vflnet.tools.bench.cli", "benchmarks that print figures side by side"),
        "sweep": Command(
            "vflnet.tools.experiments.sweep", "run a sweep file's runs (grid/zip, seeds) and tabulate them"
        ),
        "report": Command(
            "vflnet.tools.experiments.report", "Markdown and self-contained HTML report of a run or a sweep"
        ),
        "compare": Command(
            "vflnet.tools.experiments.compare", "two runs or two sweeps side by side (Markdown and HTML)"
        ),
    },
    "deploy": {
        "certs": Command("vflnet.wire.certs_cli", "make a CA and per-party certificates for mutual TLS"),
        "health": Command(
            "vflnet.wire.healthcheck", "gRPC health check of a running party (exit 0 when SERVING)"
        ),
        "lab": Command("vflnet.tools.lab.cli", "multi-host network lab in Linux network namespaces (root)"),
    },
}
COMMANDS: dict[str, Command] = {name: command for group in GROUPS.values() for name, command in group.items()}


def build_parser() -> argparse.ArgumentParser:
    """``vflnet`` itself: ``--version``, ``--help`` (each command's line, in its group) and the command's name."""
    width = max(map(len, COMMANDS)) + 2
    groups = "\n\n".join(f"{title}:\n{listing(commands, width)}" for title, commands in GROUPS.items())
    parser = argparse.ArgumentParser(
        prog="vflnet",
        usage="vflnet [-h] [--version] COMMAND ...",
        description="Vertical federated learning over a real wire: attacks and defenses.",
        epilog=f"{groups}\n\n`vflnet COMMAND --help` says what a command takes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vflnet {version('vflnet')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    for name in COMMANDS:
        sub.add_parser(name, add_help=False)  # listed in the epilog, by group; its module parses the rest
    return parser


def main(argv: list[str] | None = None) -> int:
    from vflnet.runner.parent_death import die_with_parent_if_asked

    die_with_parent_if_asked()  # a launcher's child never outlives it
    if argv is None:  # the command line (not a fork server's child): a resident server may run it
        from vflnet.runner.resident import run_in_resident_server

        code = run_in_resident_server(sys.argv[1:])
        if code is not None:
            return code
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:  # a command that says nothing of it: one line, not a traceback
        import signal

        from vflnet.runner.interrupt import INTERRUPTED_EXIT, signal_of

        signal.signal(signal.SIGINT, signal.SIG_DFL)  # ending now: a second Ctrl-C ends it at once, silently
        print(f"\n{' '.join(['vflnet', *argv[:1]])}: interrupted ({signal_of(exc).name})", file=sys.stderr)
        return INTERRUPTED_EXIT
    except Exception as exc:
        message = _error_message(exc)
        if message is None:
            raise
        print(one_line(message), file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        parser.parse_args(argv)  # --help, --version, a missing or an unknown command: each exits here
        parser.error("the command comes first: vflnet COMMAND ...")
    return COMMANDS[argv[0]].run(argv[1:])


def one_line(message: str) -> str:
    """A user error's message on one line: a library's text spread over lines (a YAML parser's
    position and caret) joined, the caret lines dropped."""
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line.strip("^ "))


def _error_message(exc: Exception) -> str | None:
    """The line a command's expected failure prints (exit code 2): a bad config, a run directory in use,
    an address taken, plaintext refused, an extra not installed, a trace that cannot be used, a path
    the file system refuses (a run directory that is a file, a folder without permission). None for
    anything else (it raises).
    Imported here, not at the top: `vflnet health` imports this module, and little."""
    from vflnet.config import ConfigError
    from vflnet.extras import MissingExtra
    from vflnet.interceptors.trace import TraceError
    from vflnet.roles.run_lock import RunDirInUse
    from vflnet.runner.resident import UnsafeFolder
    from vflnet.wire.channels import BindError, PlaintextRefused

    if isinstance(exc, ConfigError):
        return f"config error: {exc}"
    if isinstance(exc, MissingExtra | RunDirInUse | BindError | PlaintextRefused | UnsafeFolder | TraceError):
        return f"error: {exc}"
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"error: {exc.filename}: {exc.strerror}"
    return None
