"""Help texts: `vflnet COMMAND --help` imports no torch (a command's module imports its heavy parts,
torch, the config checks, the runners, where it runs them, so its help comes in a fraction of a second
on a loaded machine), and no help cites an issue number. Every registered command is checked, so a
new one is too."""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from vflnet import cli
from vflnet.cli import COMMANDS
from vflnet.tools.bench import BENCHMARKS

# `main` as the `vflnet` script calls it, with --help; then which heavy modules the process holds
PROBE = """
import contextlib, io, sys
from vflnet.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main([sys.argv[1], "--help"])
print(" ".join(m for m in ("torch", "matplotlib") if m in sys.modules))
"""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_imports_no_torch(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, command], capture_output=True, text=True, check=True
    ).stdout
    heavy = out.strip()
    assert heavy == "", f"`vflnet {command} --help` imported {heavy}"


def _helps(parser: argparse.ArgumentParser) -> Iterator[str]:
    """A parser's help and every subcommand's under it."""
    yield parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _helps(sub)


def test_no_help_text_cites_an_issue(capsys: pytest.CaptureFixture[str]) -> None:
    """A help says what an option does; an issue number tells a user nothing."""
    texts = []
    for name, command in COMMANDS.items():
        module = command.load()
        if hasattr(module, "build_parser"):
            texts += [(name, text) for text in _helps(module.build_parser())]
    for bench in BENCHMARKS:  # each benchmark parses its own flags
        with contextlib.suppress(SystemExit):
            cli.main(["bench", bench, "--help"])
        texts.append((f"bench {bench}", capsys.readouterr().out))
    assert len(texts) > len(COMMANDS)
    cited = [name for name, text in texts if re.search(r"\bissues?\s*#?\d", text, re.IGNORECASE)]
    assert cited == []
