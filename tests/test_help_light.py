"""`vflnet COMMAND --help` imports no torch: a command's module imports its heavy parts (torch, the
config checks, the runners) where it runs them, so its help comes in a fraction of a second on a
loaded machine. Every registered command is checked, so a new one is too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vflnet.cli import COMMANDS

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
