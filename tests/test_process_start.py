"""A role process's start: torch set up as the reference trainer needs it, without the imports that
only other subcommands use (each e2e run starts four of these processes on two cores)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from vflnet.config import Config
from vflnet.roles.common import setup_torch


def test_setup_torch_turns_on_deterministic_algorithms_in_warn_only_mode() -> None:
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    threads = torch.get_num_threads()
    try:
        torch._C._set_deterministic_algorithms(False)
        setup_torch(Config())
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.get_num_threads() == Config().runtime.torch_threads
    finally:
        torch._C._set_deterministic_algorithms(before[0], warn_only=before[1])
        torch.set_num_threads(threads)


def test_a_party_process_start_imports_neither_plotting_nor_the_compiler() -> None:
    # what `vflnet party` runs before it serves: the entry point, the command's module and its parser,
    # then torch's set-up
    code = (
        "import json, sys\n"
        "import vflnet.cli\n"
        "from vflnet.commands.party import build_parser\n"
        "from vflnet.config import Config\n"
        "from vflnet.roles.common import setup_torch\n"
        "build_parser().parse_args(['--role', 'passive', '--config', 'c.yaml', '--name', 'p'])\n"
        "setup_torch(Config())\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert "torch" in loaded  # the check itself ran
    heavy = sorted(m for m in loaded if m.split(".")[0] == "matplotlib" or m.startswith("torch._inductor"))
    assert heavy == []


def test_role_processes_and_the_launcher_do_not_import_scikit_learn():
    """scikit-learn takes 1-2 s to import on 2 cores: what a role process, the fork server and the
    launcher import (every registry's built-ins included) must not pull it in; the functions that need
    it import it when called (datasets read its arrays from a disk cache, binary_auc imports it)."""
    import subprocess
    import sys

    code = (
        "import importlib, sys\n"
        "from vflnet.runner.warm import PRELOAD\n"
        "for m in PRELOAD: importlib.import_module(m)\n"
        "from vflnet import registry\n"
        "for r in (registry.ATTACKS, registry.DEFENSES, registry.DATASETS, registry.MODELS, registry.PROTOCOLS):\n"
        "    r.names()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout[:500]
