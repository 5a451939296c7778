"""Scoring attack outputs against ground truth: in the launcher, after the parties have exited.

This is the only place that puts an attack's output next to the truth. The attack code never
gets a handle to it: it ran inside its host party's process and left only its output file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.config import Config
from vflnet.data.datasets import load_dataset
from vflnet.data.partition import party_view
from vflnet.extras import MissingExtra
from vflnet.registry import ATTACKS, load_plugin_modules
from vflnet.threat.interception import attack_output_path


def final_test_predictions(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The active party's predictions at the last evaluation: (sample_ids, predicted class)."""
    files = sorted((run_dir / "predictions").glob("test-epoch-*.npz"))
    if not files:
        raise FileNotFoundError(f"no test predictions in {run_dir / 'predictions'} (did the run evaluate?)")
    with np.load(files[-1]) as f:
        return f["sample_ids"], f["predicted"]


def ground_truth(cfg: Config, what: str, run_dir: Path | None = None) -> Any:
    if what == "labels+predictions":  # labels, and the active party's per-sample test predictions
        if run_dir is None:
            raise FileNotFoundError("scoring against the active party's predictions needs the run directory")
        return {"labels": ground_truth(cfg, "labels"), "predictions": final_test_predictions(run_dir)}
    if what in ("labels", "images", "features"):
        data = load_dataset(cfg.data.dataset, cfg.data.params)
        labels = dict(zip(data.ids.tolist(), data.labels.tolist(), strict=True))
        if what == "labels":
            return labels
        # each passive party's own columns or image region, raw, as that party holds it: {party: (ids, x)}
        truth: dict[str, Any] = {"labels": labels}
        for party in cfg.passives:
            view = party_view(cfg, party.name, data, as_trained=False)
            truth[party.name] = (view.ids, view.x)
        return truth
    if what == "normalized-features":  # each passive party's features as its model takes them
        # (normalised over its training rows, as the party does)
        from vflnet.data.partition import normalize
        from vflnet.threat.knowledge import run_split

        data = load_dataset(cfg.data.dataset, cfg.data.params)
        train, _ = run_split(cfg, data)
        truth = {}
        for party in cfg.passives:
            view = party_view(cfg, party.name, data, as_trained=False)
            truth[party.name] = (
                view.ids,
                normalize(view.x, view.rows(train), cfg.data.normalize, data.is_image),
            )
        return truth
    if what == "":
        return None
    raise ValueError(f"no ground truth of kind {what!r}")


def score_output(
    cfg: Config, attack_name: str, output: dict[str, np.ndarray], run_dir: Path | None = None
) -> dict[str, float]:
    cls = ATTACKS.get(attack_name)
    return cls.score(output, ground_truth(cfg, cls.truth_needed, run_dir))


def score_run(cfg: Config, run_dir: Path) -> dict[str, dict[str, float]]:
    load_plugin_modules(cfg.plugins)
    scores: dict[str, dict[str, float]] = {}
    for entry in cfg.attacks:
        path = attack_output_path(run_dir, entry)
        if not path.exists():
            scores[f"{entry.name}@{entry.party}"] = {"error": float("nan")}
            continue
        with np.load(path) as f:
            output = {k: f[k] for k in f.files}
        cls = ATTACKS.get(entry.name)
        truth = ground_truth(cfg, cls.truth_needed, run_dir)  # loaded once for the score and the pictures
        scores[f"{entry.name}@{entry.party}"] = cls.score(output, truth)
        if hasattr(cls, "pictures"):
            try:
                cls.pictures(output, truth, run_dir / "attacks")
            except MissingExtra as exc:  # the scores are written all the same
                print(f"note: no pictures of {entry.name}: {exc}", file=sys.stderr)
    if scores:
        (run_dir / "attacks" / "scores.json").write_text(json.dumps(scores, indent=2))
    return scores
