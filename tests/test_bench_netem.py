"""`vflnet bench netem`: what it reads from a run, and its skip where there is no lab."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflnet.tools.bench import netem


def _metrics(run_dir: Path, steps: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"kind": "epoch", "epoch": 0}] + [{"kind": "step", **s} for s in steps]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_step_times_and_message_sizes_come_from_the_runs_training_steps(tmp_path: Path) -> None:
    sent = {"passive-1/ExchangeEmbeddings": 8391, "active/ExchangeEmbeddings.reply": 2 * 8263}
    _metrics(
        tmp_path,
        [
            {"step_time_s": 0.030, "bytes_sent": sent},
            {"step_time_s": 0.050, "bytes_sent": sent},
            {"step_time_s": 0.020, "bytes_sent": sent},
        ],
    )
    assert netem._step_times_ms(tmp_path) == pytest.approx([30.0, 50.0, 20.0])
    assert netem._per_step_bytes(tmp_path, "passive-1", "active", 2) == (8391, 8263)


def test_without_a_lab_it_says_why_and_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(netem, "unavailable_reason", lambda: "the network lab needs root")
    out = tmp_path / "netem.json"
    assert netem.main(["--smoke", "--json", str(out)]) == 0
    assert "skipped: the network lab needs root" in capsys.readouterr().out
    assert json.loads(out.read_text()) == {"rows": [], "skipped": "the network lab needs root"}


def test_a_congestion_control_the_lab_cannot_use_is_refused_before_any_lab(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where `vflnet lab` would fail while building its namespaces, the benchmark says why and exits 2
    before it starts one, without a traceback."""
    assert netem.main(["--smoke", "--tcp-cc", "no-such-cc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vflnet bench netem: --tcp-cc: TCP congestion control 'no-such-cc' cannot be set")
    assert "Traceback" not in err
