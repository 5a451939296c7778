"""Shared helpers: small configs written to a temp folder, and a guard that keeps tests which start
vflnet processes marked e2e."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from vflnet.config import TLSConfig

REPO = Path(__file__).resolve().parents[1]

# A resident fork server the developer started (`vflnet warm start`) would run every `vflnet` command
# the suite starts; tests/test_resident_server.py turns it back on for its own, private one.
os.environ["VFLNET_RESIDENT"] = "off"

# Transport deadlines for runs on a loaded machine (four CPU-bound jobs on two cores: five processes
# importing torch take minutes to join, and a party's set-up or an inline attack can hold a step for
# over a minute). A passing run never waits them out; tests of a timeout set their own.
DEADLINES = {"rpc_timeout_s": 120, "join_timeout_s": 300}


def tls_in(folder: Path) -> TLSConfig:
    """Mutual TLS with the files `vflnet certs` writes to ``folder`` (ca.pem, <name>.pem, <name>.key)."""
    from vflnet.config import TLSConfig

    return TLSConfig(
        enabled=True,
        ca=str(folder / "ca.pem"),
        cert=str(folder / "{name}.pem"),
        key=str(folder / "{name}.key"),
    )


def base_config(
    n_passive: int = 2, aggregation: str = "concat", active_features: bool = False
) -> dict[str, Any]:
    """Digits, each passive party holding a vertical strip of the 8x8 image."""
    width = 8 // (n_passive + (1 if active_features else 0))
    strips = [[0, 8, i * width, (i + 1) * width] for i in range(n_passive + (1 if active_features else 0))]
    out = 10 if aggregation == "sum" else 16
    active: dict[str, Any] = {"name": "active", "role": "active"}
    if active_features:
        active.update(features={"region": strips.pop(0)}, bottom={"kind": "mlp", "hidden": [32], "out": out})
    parties = [{"name": "coordinator", "role": "coordinator"}, active]
    for i, strip in enumerate(strips):
        parties.append(
            {
                "name": f"passive-{i + 1}",
                "role": "passive",
                "features": {"region": strip},
                "bottom": {"kind": "mlp", "hidden": [32], "out": out},
            }
        )
    return {
        "run": {"seed": 3},
        "protocol": {"kind": "split", "aggregation": aggregation},
        "data": {"dataset": "digits", "test_fraction": 0.2},
        "parties": parties,
        "model": {"top": {"kind": "none"} if aggregation == "sum" else {"kind": "mlp", "hidden": [32]}},
        "train": {"epochs": 1, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 0.01}},
        "transport": dict(DEADLINES),
    }


def max_difference_from_reference(run_dir: Path, reference: Any) -> float:
    """The largest absolute difference between any parameter of the run's final party checkpoints
    (``run_dir/checkpoints/<party>.pt``) and the in-process reference's (``train_reference``)."""
    import torch

    worst = 0.0
    for party, modules in reference.states.items():
        saved = torch.load(run_dir / "checkpoints" / f"{party}.pt")["modules"]
        for module, state in modules.items():
            for name, expected in state.items():
                worst = max(worst, (saved[module][name] - expected).abs().max().item())
    return worst


def write_config(tmp_path: Path, data: dict[str, Any], name: str = "run.yaml") -> Path:
    """``data`` as ``tmp_path/name``, with runs under ``tmp_path`` and DEADLINES where it sets none."""
    data = copy.deepcopy(data)
    data.setdefault("run", {}).setdefault("dir", str(tmp_path / "runs"))
    transport = data.setdefault("transport", {})
    for key, value in DEADLINES.items():
        transport.setdefault(key, value)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def repo() -> Path:
    return REPO


# pyproject's timeout (300 s) guards against hangs; a slow test on a loaded machine gets longer.
SLOW_TEST_TIMEOUT_S = 1200


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-compose",
        action="store_true",
        help="also run the tests marked compose (a real container engine; `make test-compose` sets it up)",
    )


# `make test` runs pytest-xdist with --dist loadfile, which hands whole files to the two workers in
# collection order: the longest files first (from CI's --durations), so the workers end together
# instead of one of them running the last long file alone. The rest keep their order.
LONGEST_FILES_FIRST = (
    "test_resume.py",
    "test_cafe_e2e.py",
    "test_dcae_e2e.py",
    "test_cafe.py",
    "test_smoke_runs.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
    # The compose tests need the engine and base image that scripts/containers.sh prepares, so only
    # `make test-compose` (which runs it first) asks for them.
    if not config.getoption("--run-compose"):
        compose = [item for item in items if item.get_closest_marker("compose")]
        if compose:
            config.hook.pytest_deselected(items=compose)
            items[:] = [item for item in items if not item.get_closest_marker("compose")]


def _starts_vflnet(args: Any) -> bool:
    argv = [str(a) for a in args] if isinstance(args, list | tuple) else [str(args)]
    module = any(a == "-m" and b.split(".")[0] == "vflnet" for a, b in zip(argv, argv[1:], strict=False))
    return module or Path(argv[0]).name == "vflnet"


@pytest.fixture(autouse=True)
def _vflnet_processes_need_the_e2e_mark(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that starts a vflnet process (a cluster, a party, a proxy, the CLI) must be marked e2e,
    so that `make test-fast` (-m "not e2e and not slow") leaves it out."""
    if request.node.get_closest_marker("e2e"):
        return
    popen_init = subprocess.Popen.__init__

    def checked(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        if _starts_vflnet(args):
            pytest.fail(f"{request.node.nodeid} starts a vflnet process ({args}) but is not marked e2e")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked)


@pytest.fixture(autouse=True, scope="module")
def _plugins_stay_in_their_test_file() -> Iterator[None]:
    """What a test file registers (the test plug-ins its runs import: a loopback run imports a config's
    `plugins:` in this process) is gone after it: a pytest worker runs several files, and a later
    file would otherwise see another file's protocols in its registries (their names, the generated
    config docs). Its plug-in modules are forgotten too, so a later file that lists one imports and
    registers it again."""
    import sys

    from vflnet import registry

    registries = [r for r in vars(registry).values() if isinstance(r, registry.Registry)]
    for r in registries:
        r.names()  # the built-ins, before the snapshot
    entries = {r: dict(r._entries) for r in registries}
    imported = set(sys.modules)
    yield
    for r, before in entries.items():
        r._entries = before
    for name in set(sys.modules) - imported:  # the plug-in modules, not their generated messages
        if name.startswith("tests.plugins.") and name.count(".") == 2 and not name.endswith("_test"):
            del sys.modules[name]


@contextlib.contextmanager
def served_coordinator(cfg: Any, run_dir: Path) -> Iterator[tuple[Any, Any, str]]:
    """A coordinator host of ``cfg`` behind a real gRPC server on loopback (no schedule runs):
    (host, bridge, address); the server stops on exit."""
    from vflnet.interceptors.bridge import GrpcBridge
    from vflnet.roles.coordinator import CoordinatorHost

    bridge = GrpcBridge(cfg.transport)
    host = CoordinatorHost(cfg, run_dir, bridge)
    server = bridge.make_server("coordinator", host.interception.chain)
    host.add_services(server)
    address = bridge.bind(server, "coordinator", "127.0.0.1:0")
    server.start()
    try:
        yield host, bridge, address
    finally:
        server.stop(0)
