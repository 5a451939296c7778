"""Acceptance of alignment on the wire: three parties' own CSV files with string IDs (shuffled, partial
overlap), each `vflnet party` process started in its own directory that holds only its own file;
psi trains bit-identically to plain on the same rows, and under psi no raw ID crosses the wire."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import DEADLINES, base_config
from vflnet.data.sources import split_dataset
from vflnet.interceptors.trace import read_trace
from vflnet.validation import config_from_dict

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_ID = "own-files"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Path]]:
    """The config mapping (paths relative: each process opens the file in its own directory) and each
    party's file."""
    out = tmp_path_factory.mktemp("split")
    data = base_config(n_passive=2)
    sections = split_dataset(config_from_dict(data), out, overlap=0.7, seed=1)
    paths = {}
    for party in data["parties"]:
        if party["name"] in sections:
            party.pop("features", None)
            paths[party["name"]] = Path(sections[party["name"]]["path"])
            party["source"] = {**sections[party["name"]], "path": paths[party["name"]].name}
    data["data"] = {"test_fraction": 0.2}
    data["run"]["id"] = RUN_ID
    data["transport"] = dict(DEADLINES)
    data["trace"] = {"parties": ["coordinator", "passive-1"]}
    return data, paths


def _cluster(root: Path, data: dict[str, Any], paths: dict[str, Path], method: str) -> Path:
    """Start the coordinator and each party in its own directory (its file and the config only); wait
    for the run to end; the coordinator's directory."""
    cfg = {**data, "alignment": {"method": method}}
    procs = {}
    names = [p["name"] for p in data["parties"]]
    coordinator = None
    for name in names:
        home = root / name
        home.mkdir(parents=True)
        (home / "run.yaml").write_text(yaml.safe_dump(cfg))
        if name in paths:
            shutil.copy(paths[name], home / paths[name].name)
        role = next(p["role"] for p in data["parties"] if p["name"] == name)
        argv = [sys.executable, "-m", "vflnet", "party", "--role", role, "--config", "run.yaml"]
        argv += ["--name", name, "--run-dir", "run", "--listen", "127.0.0.1:0"]
        if coordinator is not None:
            argv += ["--coordinator", coordinator]
        log = (home / "stderr.log").open("w")
        procs[name] = subprocess.Popen(argv, cwd=home, stdout=log, stderr=subprocess.STDOUT)
        if coordinator is None:  # the coordinator's address, once it serves
            addr = home / "run" / "coordinator.addr"
            deadline = time.monotonic() + DEADLINES["join_timeout_s"]
            while not addr.exists() and procs[name].poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert addr.exists(), (home / "stderr.log").read_text()
            coordinator = addr.read_text().strip()
    try:
        for name, proc in procs.items():
            assert proc.wait(timeout=2 * DEADLINES["join_timeout_s"]) == 0, (
                root / name / "stderr.log"
            ).read_text()
    finally:
        for proc in procs.values():
            proc.kill()
    for name in paths:  # each process's directory held its own file only
        assert sorted(p.name for p in (root / name).glob("*.csv")) == [paths[name].name]
    return root / "coordinator" / "run"


def _trace_bytes(run_dir: Path, party: str) -> bytes:
    return (run_dir / "traces" / f"{party}.trace").read_bytes()


def _ids(paths: dict[str, Path]) -> set[str]:
    return {line.split(",")[0] for p in paths.values() for line in p.read_text().splitlines()[1:]}


def test_psi_over_three_own_files_trains_bit_identically_to_plain_and_shows_no_raw_id(tmp_path, files):
    data, paths = files
    runs = {m: _cluster(tmp_path / m, data, paths, m) for m in ("plain", "psi")}
    # the same rows, aligned: the same training, bit for bit (losses, metrics, every party's model)
    metrics = {m: [line for line in (r / "metrics.jsonl").read_text().splitlines()] for m, r in runs.items()}
    strip = [_without_times(line) for line in metrics["plain"]]
    assert strip == [_without_times(line) for line in metrics["psi"]]
    for name in paths:
        model = {m: (tmp_path / m / name / "run" / "checkpoints" / f"{name}.pt").read_bytes() for m in runs}
        assert model["plain"] == model["psi"], name
    # no raw ID in the coordinator's or a passive party's trace under psi (under plain: every one)
    ids = _ids(paths)
    for party, home in (("coordinator", "coordinator"), ("passive-1", "passive-1")):
        traced = {m: _trace_bytes(tmp_path / m / home / "run", party) for m in runs}
        assert sum(i.encode() in traced["plain"] for i in ids) > len(ids) // 2, party
        assert not [i for i in ids if i.encode() in traced["psi"]], party
    # an observer of passive-1's channel: its alignment messages, and a dictionary of every candidate ID
    # (hashed as `hashed` does, and as psi hashes before blinding) matches none of them
    seen = b"".join(
        e.message.items
        for e in read_trace(tmp_path / "psi" / "passive-1" / "run" / "traces" / "passive-1.trace")
        if e.short_method == "Align" and e.direction == "response"
    )
    assert len(seen) >= 32 * len(ids) // 2
    chunks = {seen[k : k + 32] for k in range(0, len(seen), 32)}
    from vflnet.roles.alignment import DOMAIN

    dictionary = {hashlib.sha256(i.encode()).digest() for i in ids} | {
        hashlib.sha256(DOMAIN + i.encode()).digest() for i in ids
    }
    assert not chunks & dictionary


def _without_times(line: str) -> str:
    import json

    record = json.loads(line)
    for key in ("step_time_s", "time_s"):
        record.pop(key, None)
    return json.dumps(record, sort_keys=True)


@pytest.mark.parametrize(("method", "recovered"), [("plain", 1.0), ("hashed", 1.0), ("psi", 0.0)])
def test_the_coordinator_recovers_every_id_under_plain_and_hashed_none_under_psi_and_probes_leak_under_all(
    tmp_path, method, recovered
):
    """The ID-recovery attack reads plain IDs, matches a dictionary against hashed ones and matches none
    under psi; the membership probe learns exactly which of its probes every other party holds."""
    import json

    from tests.conftest import write_config
    from vflnet.runner.local import run_local

    data = base_config(n_passive=2)
    data["parties"][3]["sample_fraction"] = 0.8  # IDs outside the intersection
    data["alignment"] = {"method": method}
    data["attacks"] = [
        {"name": "alignment-id-recovery", "party": "coordinator"},
        {"name": "alignment-membership-probe", "party": "passive-1", "params": {"probes": 40}},
    ]
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    scores = json.loads((tmp_path / "run" / "attacks" / "scores.json").read_text())
    recovery = scores["alignment-id-recovery@coordinator"]
    assert recovery["id_recovery"] == recovered and recovery["non_intersection"] > 300, recovery
    probe = scores["alignment-membership-probe@passive-1"]  # passive-2 lacks some: a guess cannot be right
    assert (
        probe["membership_accuracy"] == 1.0 and probe["probed"] == 40 and probe["membership_baseline"] < 0.95
    ), probe


def test_a_resumed_psi_run_does_not_align_again_and_ends_as_the_run_left_alone(tmp_path, files):
    """The coordinator is killed mid-run; `vflnet run --resume` continues from the checkpoint with the
    alignment both sides recorded: no Align message after the first session, the same losses."""
    from collections import Counter

    from tests.conftest import write_config
    from tests.test_resume import _kill_at, _launch, _steps
    from vflnet.runner.local import run_local

    data, paths = files
    data = {**data, "alignment": {"method": "psi"}, "trace": {"parties": ["all"]}}
    data["parties"] = [
        {**p, "source": {**p["source"], "path": str(paths[p["name"]])}} if "source" in p else p
        for p in data["parties"]
    ]
    data["train"] = {**data["train"], "epochs": 4, "checkpoint_every_steps": 3}
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "alone", progress=False) == 0
    run_dir, log = tmp_path / "killed", tmp_path / "killed.log"
    proc = _launch([str(path), "--run-dir", str(run_dir)], log)
    _kill_at(proc, run_dir, "coordinator", 8, log)
    record = (run_dir / "alignment.json").read_text()
    proc = _launch(["--resume", str(run_dir)], log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    summary = __import__("json").loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] > 0
    assert (run_dir / "alignment.json").read_text() == record
    assert [(r["step"], r["loss"]) for r in _steps(run_dir)] == [
        (r["step"], r["loss"]) for r in _steps(tmp_path / "alone")
    ]

    def aligns(folder: Path) -> Counter[str]:
        return Counter(
            f"{trace.stem} {e.side} {e.direction}"
            for trace in (folder / "traces").glob("*.trace")
            for e in read_trace(trace)
            if e.short_method == "Align"
        )

    assert aligns(run_dir) == aligns(tmp_path / "alone") and aligns(run_dir)


def test_a_party_whose_file_is_bad_fails_the_run_with_one_line_naming_party_file_and_column(
    tmp_path, files, capsys
):
    from tests.conftest import write_config
    from vflnet.runner.local import run_local

    data, paths = files
    bad = tmp_path / "passive-2.csv"
    header, first, *rest = paths["passive-2"].read_text().splitlines()
    bad.write_text("\n".join([header, first, *rest, first]) + "\n")  # its first ID twice
    data = {**data, "trace": {"parties": []}}
    data["parties"] = [
        {**p, "source": {**p["source"], "path": str(bad if p["name"] == "passive-2" else paths[p["name"]])}}
        if "source" in p
        else p
        for p in data["parties"]
    ]
    assert run_local(write_config(tmp_path, data), run_dir=tmp_path / "run", progress=False) != 0
    err = capsys.readouterr().err
    assert f"party 'passive-2', file {bad}, column 'id': duplicate ID {first.split(',')[0]!r}" in err, err
    assert "Traceback" not in err


def test_an_empty_intersection_under_psi_fails_at_admission_naming_the_files(tmp_path):
    import json

    from tests.conftest import write_config
    from vflnet.runner.local import run_local

    data = base_config(n_passive=1)
    data["data"] = {"test_fraction": 0.2}
    data["alignment"] = {"method": "psi"}
    active, passive = data["parties"][1], data["parties"][2]
    passive.pop("features")
    (tmp_path / "a.csv").write_text("id,label\n" + "".join(f"a{i},{i % 2}\n" for i in range(20)))
    (tmp_path / "p.csv").write_text("id,x\n" + "".join(f"p{i},{i}\n" for i in range(20)))
    active["source"] = {"path": str(tmp_path / "a.csv"), "label_column": "label"}
    passive["source"] = {"path": str(tmp_path / "p.csv"), "features": ["x"]}
    assert run_local(write_config(tmp_path, data), run_dir=tmp_path / "run", progress=False) != 0
    error = json.loads((tmp_path / "run" / "summary.json").read_text())["error"]
    assert "no sample id is common to all parties (active holds 20, passive-1 holds 20)" in error, error
    assert "parties[1].source.path" in error and "parties[2].source.path" in error, error
