"""A child started with child_env dies with its parent (vflnet/runner/parent_death.py), without any
Python code between fork and exec in the parent."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = (
    "from vflnet.runner.parent_death import die_with_parent_if_asked as d; d(); import time; time.sleep(120)"
)
PARENT = f"""
import os, subprocess, sys
sys.path.insert(0, {str(REPO)!r})
from vflnet.runner.parent_death import child_env
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=child_env(dict(os.environ)))
print(child.pid, flush=True)
sys.stdin.readline()  # the test says when to die
"""


def test_a_child_dies_with_its_parent():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert parent.stdout is not None and parent.stdin is not None
    child = int(parent.stdout.readline())
    watch = os.pidfd_open(child)
    try:
        ready, _, _ = select.select([watch], [], [], 1.0)
        assert not ready, "the child ended while its parent lived"
        parent.kill()  # SIGKILL: no handler of the parent's runs
        parent.wait(60)
        ready, _, _ = select.select([watch], [], [], 60.0)  # the kernel's SIGTERM ends the child
        assert ready, "the child outlived its parent"
    finally:
        if not select.select([watch], [], [], 0)[0]:  # stop what the test started, whatever happened
            os.kill(child, 9)
        os.close(watch)
        parent.stdin.close()
        parent.stdout.close()
