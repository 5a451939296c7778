"""docker-compose for real: the image from deploy/Dockerfile, the plain cluster, the mutual-TLS overlay
and the attacker overlay, each trained end to end in separate containers on a real engine.

Run by `make test-compose` (part of `make test`), which prepares the engine and a local base image
with scripts/containers.sh first; a plain `pytest` leaves these tests out (tests/conftest.py,
``--run-compose``). Each test uses its own compose project and removes its containers, networks
and volumes; the images stay as the cache for the next run.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.compose, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

BASE_IMAGE = os.environ.get("VFLNET_TEST_BASE_IMAGE", "vflnet-pybase:py3.11")
PLAIN = ["docker-compose.yml"]
TLS = ["docker-compose.yml", "deploy/compose.tls.yml"]
ATTACKER = ["docker-compose.yml", "deploy/compose.attacker.yml"]
TLS_ATTACKER = ["docker-compose.yml", "deploy/compose.tls.yml", "deploy/compose.attacker.yml"]
FILES = ["docker-compose.yml", "deploy/compose.files.yml"]
RUN_TIMEOUT_S = 900  # one compose run of the digits job; a broken file fails long before


def compose_cmd(project: str, files: list[str], *args: str) -> list[str]:
    cmd = ["docker-compose", "--project-name", project, "--project-directory", str(REPO)]
    for f in files:
        cmd += ["-f", str(REPO / f)]
    return [*cmd, *args]


def sh(cmd: list[str], timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


class Cluster:
    """One compose project: ``up`` runs the job to the coordinator's exit, ``down`` removes it all."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.project = f"vflnet-test-{uuid.uuid4().hex[:8]}"

    def compose(
        self, *args: str, timeout: float = RUN_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return sh(compose_cmd(self.project, self.files, *args), timeout, check)

    def up(self) -> subprocess.CompletedProcess[str]:
        return self.compose("up", "--no-build", "--exit-code-from", "coordinator", check=False)

    def read(self, path: str, service: str = "coordinator") -> bytes:
        """A file from a stopped container (the coordinator's: the `runs` volume is mounted there)."""
        return self.files_in(path, service)[0][1]

    def files_in(self, path: str, service: str) -> list[tuple[str, bytes]]:
        """Every file at or under ``path`` in ``service``'s stopped container: (name, contents)."""
        (cid,) = self.compose("ps", "-q", service, timeout=60).stdout.split()
        tar = subprocess.run(
            ["docker", "cp", f"{cid}:{path}", "-"], capture_output=True, timeout=60, check=True
        )
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:  # docker cp streams a tar
            found = []
            for member in archive.getmembers():
                data = archive.extractfile(member) if member.isfile() else None
                if data is not None:
                    found.append((member.name, data.read()))
            assert found, f"no file at {path} in {service}"
            return found

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", service, timeout=60).stdout

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", timeout=180, check=False)


def summary_of(cluster: Cluster) -> dict:
    return json.loads(cluster.read("/runs/" + run_id(cluster) + "/summary.json"))


def run_id(cluster: Cluster) -> str:
    return "digits-compose-tls" if "deploy/compose.tls.yml" in cluster.files else "digits-compose"


@pytest.fixture(scope="module")
def engine() -> None:
    if shutil.which("docker-compose") is None or sh(["docker", "info"], 30, check=False).returncode != 0:
        pytest.fail("no container engine: run `bash scripts/containers.sh prepare` (make test-compose does)")


@pytest.fixture(scope="module")
def image(engine: None) -> str:
    """vflnet:0.1.0 built by compose from deploy/Dockerfile on the local base image."""
    build = ["build", "--force-rm", "--build-arg", f"BASE={BASE_IMAGE}", "active"]
    sh(compose_cmd("vflnet-test-build", PLAIN, *build), 1800)
    # the image this build replaced, if any (not other projects' dangling images)
    sh(
        ["docker", "image", "prune", "--force", "--filter", "label=org.opencontainers.image.title=vflnet"],
        300,
    )
    return "vflnet:0.1.0"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same job (configs/digits-2p.yaml, kept equal to configs/compose.yaml) with `vflnet run`."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    vflnet = str(REPO / ".venv" / "bin" / "vflnet")
    sh(
        [vflnet, "run", str(REPO / "configs" / "digits-2p.yaml"), "--run-dir", str(run_dir), "--no-progress"],
        900,
    )
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def trained(image: str, reference: dict) -> Iterator[Callable[[list[str]], Cluster]]:
    """Runs the compose files' cluster to the coordinator's exit (making certificates first under
    TLS) and checks it ended like `vflnet run`; removes every project it made afterwards."""
    made: list[Cluster] = []

    def train(files: list[str]) -> Cluster:
        cluster = Cluster(files)
        made.append(cluster)
        if "deploy/compose.tls.yml" in files:
            cluster.compose("run", "--rm", "certs", timeout=300)
        result = cluster.up()
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        final, expected = summary_of(cluster)["final"], reference["final"]
        assert (final["test_accuracy"], final["test_loss"]) == (
            expected["test_accuracy"],
            expected["test_loss"],
        )
        return cluster

    yield train
    for cluster in made:
        cluster.down()


def relay_counts(log: str) -> tuple[int, int]:
    """(bytes relayed both ways, vflnet messages seen) from the relay's last line."""
    m = re.search(r"relayed \d+ connections, (\d+) B up, (\d+) B down, (\d+) vflnet messages seen", log)
    assert m, f"the relay printed no summary:\n{log[-3000:]}"
    return int(m[1]) + int(m[2]), int(m[3])


def test_plain_cluster_trains_like_vflnet_run(trained) -> None:
    trained(PLAIN)


def test_tls_overlay_trains_like_vflnet_run(trained) -> None:
    trained(TLS)


def test_attacker_reads_plaintext_traffic(trained) -> None:
    relayed, seen = relay_counts(trained(ATTACKER).logs("proxy"))
    assert relayed > 0 and seen > 0


def test_attacker_reads_nothing_under_mutual_tls(trained) -> None:
    relayed, seen = relay_counts(trained(TLS_ATTACKER).logs("proxy"))
    assert relayed > 0, "the parties did not go through the relay"
    assert seen == 0


def test_per_party_files_cluster_aligns_by_psi_and_no_passive_container_holds_a_label(image: str) -> None:
    """deploy/compose.files.yml: the one-shot split service writes each party's own file into that
    party's volume; every party mounts only its own, the run aligns them by PSI and trains."""
    cluster = Cluster(FILES)
    try:
        cluster.compose("run", "--rm", "split", timeout=600)
        result = cluster.up()
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        summary = json.loads(cluster.read("/runs/digits-compose-files/summary.json"))
        assert summary["status"] == "completed", summary
        assert summary["final"]["test_accuracy"] > 0.5, summary["final"]  # digits: chance is 0.1
        for name in ("active", "passive-1", "passive-2"):
            files = cluster.files_in("/data", name)
            assert [f.rsplit("/", 1)[-1] for f, _ in files] == [f"{name}.csv"], files  # its own file only
            header = files[0][1].decode().splitlines()[0].split(",")
            assert ("label" in header) == (name == "active"), header
        aligned = json.loads(cluster.read("/runs/digits-compose-files/alignment.json"))
        assert aligned["method"] == "psi" and 0 < aligned["n_common"] < 1797, aligned  # 70% of digits common
    finally:
        cluster.down()
