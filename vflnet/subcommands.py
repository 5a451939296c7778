"""How every sub-command is registered: a table of :class:`Command` (name -> the module that runs it
and its line of help). `vflnet` itself (vflnet/cli.py), `vflnet bench` (vflnet/tools/bench) and
`vflnet reproduce` (vflnet/tools/reproduce/cli.py) are such tables; a command's own actions (`vflnet
config check`, `vflnet lab up`) are its module's argparse sub-parsers, each with ``run=`` the function
that runs it (:func:`add_action`).

A command's module is imported only when the command runs (its ``--help`` included), so a table costs
nothing to read: ``vflnet health`` runs every few seconds in every container. This module imports
nothing of vflnet.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import NamedTuple


class Command(NamedTuple):
    """A sub-command: the module whose ``main(argv)`` runs it (argv: the words after its name; its
    ``build_parser()`` makes the parser), and its line in the help of the command above it."""

    module: str
    help: str

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def run(self, argv: list[str]) -> int:
        return int(self.load().main(argv) or 0)


def listing(commands: Mapping[str, Command], width: int, indent: int = 4) -> str:
    """One line per command, its name (in ``width`` columns) and its help, as argparse lists sub-parsers."""
    return "\n".join(f"{' ' * indent}{name:<{width}}{c.help}" for name, c in commands.items())


Action = Callable[[argparse.Namespace], int]


def add_action(
    sub: argparse._SubParsersAction, name: str, run: Action, help: str, **kwargs: object
) -> argparse.ArgumentParser:
    """A command's action: a sub-parser whose parsed arguments :func:`run_action` hands to ``run``."""
    parser = sub.add_parser(name, help=help, description=kwargs.pop("description", help), **kwargs)
    parser.set_defaults(run=run)
    return parser


def run_action(args: argparse.Namespace) -> int:
    """Run the action that :func:`add_action` registered for the parsed arguments."""
    return int(args.run(args) or 0)
