"""The `vflnet` command: :data:`COMMANDS`, one entry per subcommand, each run by a module of its own.

A command's module parses and runs its arguments (``build_parser()``, ``main(argv)`` with argv after
the command's name) and is imported only when the command runs: ``vflnet health`` runs every few
seconds in every container, and a party process should not import plotting. So this module imports
nothing of vflnet at the top.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from importlib.metadata import version
from types import ModuleType


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, its line in ``vflnet --help``, and the module that runs it."""

    name: str
    help: str
    module: str

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


COMMANDS = {
    command.name: command
    for command in (
        Command("run", "run a local cluster (one process per party) from a config", "vflnet.commands.run"),
        Command(
            "party",
            "start one role's process (how docker-compose and lab machines start parties)",
            "vflnet.commands.party",
        ),
        Command("config", "config tools", "vflnet.commands.config"),
        Command(
            "datasets",
            "list the registered datasets (no downloads) and their parameters",
            "vflnet.commands.datasets",
        ),
        Command(
            "models",
            "list the registered model kinds (`kind:` of a bottom or top model block)",
            "vflnet.commands.models",
        ),
        Command("attacks", "list the registered attacks and their parameters", "vflnet.commands.attacks"),
        Command("defenses", "list the registered defenses and their parameters", "vflnet.commands.defenses"),
        Command(
            "examples",
            "copy the example configs (and sweep files) shipped with vflnet into a folder",
            "vflnet.example_configs",
        ),
        Command("certs", "make a CA and per-party certificates for mutual TLS", "vflnet.wire.certs_cli"),
        Command(
            "health", "gRPC health check of a running party (exit 0 when SERVING)", "vflnet.wire.healthcheck"
        ),
        Command(
            "proxy",
            "man-in-the-middle proxy between parties (taps, rewrites, TCP relay)",
            "vflnet.roles.proxy",
        ),
        Command("trace", "list, show and export wire traces", "vflnet.interceptors.trace_cli"),
        Command(
            "data", "a party's own data: `split` a dataset into one file per party", "vflnet.commands.data"
        ),
        Command("attack", "run an attack offline over a recorded trace", "vflnet.runner.offline"),
        Command(
            "reproduce",
            "paper reproductions whose results docs/attacks.md reports",
            "vflnet.tools.reproduce.cli",
        ),
        Command("lab", "multi-host network lab in Linux network namespaces (root)", "vflnet.tools.lab.cli"),
        Command(
            "sweep",
            "run a sweep file's runs (grid/zip, seeds) and tabulate them",
            "vflnet.tools.experiments.sweep",
        ),
        Command(
            "report",
            "Markdown and self-contained HTML report of a run or a sweep",
            "vflnet.tools.experiments.report",
        ),
        Command(
            "compare",
            "two runs or two sweeps side by side (Markdown and HTML)",
            "vflnet.tools.experiments.compare",
        ),
        Command(
            "audit",
            "which registered attacks apply to a run config, each run and scored",
            "vflnet.tools.audit.cli",
        ),
        Command("bench", "benchmarks that print figures side by side", "vflnet.tools.bench.cli"),
        Command(
            "warm",
            "a resident fork server (torch imported) that later commands start from: start, stop, status",
            "vflnet.commands.warm",
        ),
    )
}


def build_parser() -> argparse.ArgumentParser:
    """``vflnet`` itself: ``--version``, ``--help`` (a line for each command) and the command's name."""
    parser = argparse.ArgumentParser(
        prog="vflnet", description="Vertical federated learning over a real wire: attacks and defenses."
    )
    parser.add_argument("--version", action="version", version=f"vflnet {version('vflnet')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        sub.add_parser(command.name, help=command.help, add_help=False)  # its module parses the rest
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
    rc = COMMANDS[argv[0]].load().main(argv[1:])
    return 0 if rc is None else int(rc)


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
