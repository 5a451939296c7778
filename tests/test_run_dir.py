"""Run directories are claimed atomically: launchers started in the same second never share one."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from vflnet.config import Config
from vflnet.runner.local import choose_run_dir

LAUNCHERS = 8


def _claim(parent: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:
    cfg = Config()
    cfg.run.dir = parent
    cfg.run.id = "same-second"  # what two launchers of one config in one second both compute
    barrier.wait()
    out.put(str(choose_run_dir(cfg, Path("digits.yaml"), None)))


def test_launchers_started_together_each_get_their_own_directory(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(3):
        parent = tmp_path / f"round-{round_}"
        barrier = ctx.Barrier(LAUNCHERS)
        out = ctx.Queue()
        procs = [ctx.Process(target=_claim, args=(str(parent), barrier, out)) for _ in range(LAUNCHERS)]
        for p in procs:
            p.start()
        chosen = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        assert len(set(chosen)) == LAUNCHERS, sorted(chosen)
        assert sorted(p.name for p in parent.iterdir()) == sorted(Path(c).name for c in chosen)


def test_a_given_run_directory_is_used_as_it_is(tmp_path: Path) -> None:
    given = tmp_path / "mine"
    given.mkdir()
    cfg = Config()
    assert choose_run_dir(cfg, Path("digits.yaml"), given) == given
    assert cfg.run.id.startswith("digits-")
