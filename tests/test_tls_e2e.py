"""A whole training run over mutual TLS between real processes, and a run whose certificate does
not match its party name is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import base_config, write_config
from vflnet.runner.local import run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _certs(tmp_path, repo, parties):
    out = subprocess.run(
        [sys.executable, "-m", "vflnet", "certs", "--out", str(tmp_path / "certs"), "--party", *parties],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,  # a loaded machine; only a hang runs into it
    )
    assert out.returncode == 0, out.stderr


def _tls_config(tmp_path):
    data = base_config(n_passive=2)
    data["train"].update(max_steps=4)
    certs = tmp_path / "certs"
    data["transport"]["tls"] = {
        "enabled": True,
        "ca": str(certs / "ca.pem"),
        "cert": str(certs / "{name}.pem"),
        "key": str(certs / "{name}.key"),
    }
    return data


def test_training_over_mutual_tls(tmp_path, repo):
    _certs(
        tmp_path, repo, ["coordinator:coordinator", "active:active", "passive-1:passive", "passive-2:passive"]
    )
    path = write_config(tmp_path, _tls_config(tmp_path))
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0


def test_a_certificate_for_another_role_is_refused(tmp_path, repo, capsys):
    # passive-2's certificate says it is an active party: the active party refuses its embeddings
    _certs(
        tmp_path, repo, ["coordinator:coordinator", "active:active", "passive-1:passive", "passive-2:active"]
    )
    path = write_config(tmp_path, _tls_config(tmp_path))
    assert run_local(path, run_dir=tmp_path / "run", progress=False) != 0
    err = capsys.readouterr().err
    assert "FAILED" in err and "PERMISSION_DENIED" in (tmp_path / "run/logs/passive-2.log").read_text() + err
