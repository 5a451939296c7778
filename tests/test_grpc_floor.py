"""`vflnet bench grpc-floor`: its message patterns run the steps they are asked for, and its bare trace
tap records every message each process sends or receives, once, whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vflnet.tools.bench import grpc_floor
from vflnet.tools.bench.grpc_floor import BATCH, EMBEDDING, WARMUP, distributed

EMBEDDINGS = 5 + BATCH * EMBEDDING * 4  # party byte, step, float32 values
GRADIENT = BATCH * EMBEDDING * 4
COMMAND = 4  # the step number


def _frames(path: Path) -> list[int]:
    """The sizes of the length-prefixed messages in one process's trace file."""
    data = path.read_bytes()
    sizes, at = [], 0
    while at < len(data):
        n = int.from_bytes(data[at : at + 4], "little")
        sizes.append(n)
        at += 4 + n
    assert at == len(data), f"{path.name}: a partial last frame"
    return sizes


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["coordinated", "all-streams"])
def test_the_floor_tap_records_every_message_of_every_process(mode: str, tmp_path: Path) -> None:
    steps = 4
    assert distributed(steps, mode, str(tmp_path)) > 0
    total = WARMUP + steps
    counts = {p.stem: sorted(_frames(p)) for p in tmp_path.glob("*.trace")}
    # per step: the coordinator sends each of the three parties a command and gets it back; a passive
    # party receives a command, sends embeddings, gets a gradient, answers; the active party receives
    # two commands' worth of embeddings and answers each, plus its own command
    assert counts == {
        "coordinator": sorted([COMMAND] * 6 * total),
        "active": sorted([COMMAND] * 2 * total + [EMBEDDINGS] * 2 * total + [GRADIENT] * 2 * total),
        "passive-0": sorted([COMMAND] * 2 * total + [EMBEDDINGS] * total + [GRADIENT] * total),
        "passive-1": sorted([COMMAND] * 2 * total + [EMBEDDINGS] * total + [GRADIENT] * total),
    }
    assert not grpc_floor._TAP_FD  # the coordinator's file is closed again


@pytest.mark.e2e
def test_the_floor_tap_ab_taps_the_even_blocks_and_times_every_step(tmp_path: Path) -> None:
    """`vflnet bench goals` times the bare tap inside one run: every message of the steps of even blocks
    is recorded, no message of the odd blocks, and each timed step comes back with its time."""
    steps, blocks = 30, 10
    times = grpc_floor.tap_ab(steps, "coordinated", str(tmp_path), blocks)
    assert [step for step, _ in times] == list(range(WARMUP, WARMUP + steps))
    assert all(seconds > 0 for _, seconds in times)
    tapped = sum(1 for step in range(WARMUP + steps) if step // blocks % 2 == 0)  # steps 0-9, 20-29, 40-49
    counts = {p.stem: sorted(_frames(p)) for p in tmp_path.glob("*.trace")}
    assert counts["coordinator"] == [COMMAND] * 6 * tapped
    assert counts["active"] == sorted(
        [COMMAND] * 2 * tapped + [EMBEDDINGS] * 2 * tapped + [GRADIENT] * 2 * tapped
    )
    assert counts["passive-0"] == sorted([COMMAND] * 2 * tapped + [EMBEDDINGS] * tapped + [GRADIENT] * tapped)
    assert not grpc_floor._TAP_FD and not grpc_floor._TAP_BLOCKS  # the coordinator taps every step again


@pytest.mark.e2e
def test_grpc_floor_prints_a_line_per_finished_run(tmp_path: Path) -> None:
    """Without a terminal (no bar) the command still shows how far it is: one stderr line per run."""
    done = subprocess.run(
        [sys.executable, "-m", "vflnet", "bench", "grpc-floor", "--smoke", "--modes", "unary"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("run ")]
    assert [line.split(":")[0] for line in lines] == ["run 1 of 1, reference", "run 1 of 1, unary"]
    assert all(line.endswith("steps/s") for line in lines)
