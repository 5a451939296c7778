"""Every role of a run in this process, over the loopback bridge (``transport.bridge: loopback``).

The coordinator and each party run the same host and protocol code as in their own processes, each
on its own thread; every message is still serialized through protobuf and passes the same mod chains
(taps, rewrites, traces) and meters. Experiments, benchmarks and tests use it where separate processes
add nothing; a loopback run ends bit-identical to the same run over gRPC.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch

from vflnet.config import Config, calls_at_once
from vflnet.interceptors.bridge import LoopbackBridge
from vflnet.roles import coordinator
from vflnet.roles.common import setup_torch
from vflnet.roles.party import PartyHost, serve
from vflnet.roles.run_lock import role_lock
from vflnet.wire.loopback import SCHEME, LoopbackHub


class LoopbackFailure(RuntimeError):
    pass


def run_loopback(
    cfg: Config, run_dir: Path, on_tick: Callable[[], None] | None = None, resume: bool = False
) -> None:
    """Run to completion; raises LoopbackFailure naming each role that did not end cleanly. ``resume``:
    every role continues from the run directory's newest valid coordinated checkpoint, as
    `vflnet run --resume` does with processes (the experiment drivers use it to run in pieces)."""
    if any(p.via for p in cfg.parties):
        raise LoopbackFailure(
            "`via` (a proxy in front of a party) needs real processes: use transport.bridge: grpc"
        )
    with ExitStack() as locks:  # as `vflnet party` does for its one role, before anything is written
        for p in cfg.parties:
            locks.enter_context(role_lock(run_dir, p.name))
        _run_roles(cfg, run_dir, on_tick, resume)


def _run_roles(cfg: Config, run_dir: Path, on_tick: Callable[[], None] | None, resume: bool) -> None:
    threads_before = torch.get_num_threads()
    setup_torch(cfg)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / "loopback.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("vflnet")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(getattr(logging, cfg.runtime.log_level))
    # every thread that runs party code computes with the configured torch thread count, as a party
    # process does (OpenMP keeps it per thread), so a loopback run ends bit-identical to a gRPC run
    threads = cfg.runtime.torch_threads
    hub = LoopbackHub(lambda: torch.set_num_threads(threads), server_threads=calls_at_once(len(cfg.parties)))
    bridge = LoopbackBridge(hub)
    codes: dict[str, int | BaseException] = {}

    def role(name: str, fn: Callable[[], int]) -> threading.Thread:
        def body() -> None:
            torch.set_num_threads(threads)
            try:
                codes[name] = fn()
            except BaseException as exc:  # reported below, with the role's name
                logging.getLogger("vflnet.loopback").exception("%s failed", name)
                codes[name] = exc

        return threading.Thread(target=body, name=name, daemon=True)

    try:
        # Hosts are built here, one after another: model initialisation seeds torch's global generator.
        hosts = [
            PartyHost(cfg, p.name, run_dir, bridge, resume=resume)
            for p in cfg.parties
            if p.role != "coordinator"
        ]
        coord_address = f"{SCHEME}{cfg.coordinator.name}"
        coord = role(
            cfg.coordinator.name, lambda: coordinator.main(cfg, run_dir, coord_address, bridge, resume=resume)
        )
        parties = [role(h.name, lambda h=h: serve(h, "", coord_address, "")) for h in hosts]
        for t in (coord, *parties):
            t.start()
        while coord.is_alive():
            coord.join(0.1)
            if on_tick is not None:
                on_tick()
        # Parties end on the coordinator's Shutdown; after a failed coordinator they may be waiting on it.
        deadline = time.monotonic() + (cfg.transport.rpc_timeout_s if codes.get(coord.name) == 0 else 5.0)
        for t in parties:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
        torch.set_num_threads(threads_before)
    failed = {n: c for n, c in codes.items() if c != 0}
    failed.update({t.name: "did not stop" for t in parties if t.is_alive()})
    if failed:
        details = "; ".join(
            f"{n}: {c if not isinstance(c, int) else f'exit code {c}'}" for n, c in failed.items()
        )
        if isinstance(failed.get(cfg.coordinator.name), int):  # it failed the run: summary.json says why
            details += f" ({_summary_error(run_dir)})"
        raise LoopbackFailure(f"{details} (log: {run_dir / 'logs' / 'loopback.log'})")


def _summary_error(run_dir: Path) -> str:
    """The error the coordinator wrote into summary.json when it failed the run."""
    try:
        return str(json.loads((run_dir / "summary.json").read_text()).get("error") or "no error given")
    except (OSError, ValueError):
        return "no summary.json"
