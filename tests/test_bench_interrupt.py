"""`vflnet bench transport` stopped by SIGTERM: a one-line message, exit code 130, no traceback and no
process of its runs left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    "when",
    ["processes, run directory", "roles in this process (loopback bridge)"],
    ids=["grpc-run", "loopback-run"],
)
def test_sigterm_stops_bench_transport_without_a_traceback(tmp_path: Path, when: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflnet", "bench", "transport", "--smoke"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, TMPDIR=str(tmp_path), VFLNET_QUIET="1"),
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the launcher's own line: the run has started
        seen.append(line)
        if when in line:
            break
    else:
        pytest.fail(f"bench transport ended before its {when!r} line: {''.join(seen)}")
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "bench transport interrupted" in err
    for processes in tmp_path.glob("**/processes.json"):  # a gRPC run's children are all gone
        for child in json.loads(processes.read_text()).values():
            with pytest.raises(ProcessLookupError):
                os.kill(child["pid"], 0)
