"""The audit's runs and scores.

Per defense setting (none, then each of ``--defenses``) and per seed:

- one run with every applicable attack that only observes (taps, the own view, the prediction phase):
  one run, many taps; it is also the setting's main-task accuracy and time, and it records the traces
  of the parties a man in the middle would read;
- one run per attack that rewrites messages or its party's own data (it changes the training the
  others would observe).

Each run is a real run (`vflnet.runner.local.run_local`: one process per party over gRPC, or every
role in one process over the loopback bridge, as the config's ``transport.bridge`` says), scored by the
launcher after the parties exit (``attacks/scores.json``). A man in the middle's row is the attack run
offline over the trace of the party whose channel it reads. Runs are resumable as sweeps are: a run
works in ``<name>.partial`` and is renamed once its summary says completed; a finished run is not
run again.

Every attack is scored with its own ``score`` against ground truth, and its leakage metric against
the metric's baseline (``METRICS``: the strongest trivial attacker) and, with ``--null``, against the
same runs with the labels permuted (``data.permute_labels``): the mean over seeds with a 95% interval, a
one-sided p-value, Holm's correction over the audit's rows (``correct``), and for label attacks the
low-FPR and epsilon figures of their per-sample output (``auditing_figures``). docs/audit.md defines
every verdict.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vflnet.config import Config, ConfigError
from vflnet.metrics.intervals import mean_ci
from vflnet.registry import ATTACKS, DEFENSES
from vflnet.tools.audit.budget import QUICK_TRAIN
from vflnet.tools.audit.selection import Candidate, with_entries
from vflnet.tools.experiments.results import PARTIAL, complete, is_completed, read_json, write_atomic
from vflnet.validation import config_from_dict

# the verdict of a row whose attack (or a defense of its run) acted zero times, as the host counted it
# (summary.json's effects, vflnet/threat/effects.py): never a score, whatever its output says
NEVER_ACTED = "failed: never acted"
# metrics scored a second time against the run without the attack (``attack_scores``)
PAIRED = ("asr",)


# ------------------------------------------------------------------------------------ metrics
@dataclass(frozen=True)
class Metric:
    """A leakage metric an attack's ``score`` may report, and its baseline: the same metric for an
    attacker without the leak (chance, a random guess, the paper's trivial baseline)."""

    key: str
    what: str
    baseline: str  # how the baseline is found, in words
    higher_leaks: bool = True
    count: str = ""  # the score that counts the samples of a rate: the interval pools them over the seeds
    bounded: bool = True  # a rate in [0, 1]
    # practical difference: closer to the baseline a result is "at baseline" (absolute; for a metric where
    # lower leaks, relative to the baseline)
    margin: float = 0.02


METRICS = (
    Metric("psnr", "reconstruction PSNR (dB)", "a uniform random image", margin=1.0, bounded=False),
    Metric("ssim", "reconstruction SSIM", "0 (no structure)", bounded=False),
    Metric(
        "asr",
        "backdoor attack success rate",
        "the same test samples in the run without the attack (else chance)",
        count="triggered_test",
    ),
    Metric("auc", "leak AUC", "0.5 (random scores)"),
    Metric(
        "label_accuracy",
        "label accuracy",
        "the better of always the majority class, on the same samples, and a uniform guess (1 / classes)",
        count="samples",
    ),
    Metric(
        "cbr",
        "correct branching rate",
        "the best of a U(0, 1) guess, a random path, each split's majority side and draws from each feature's "
        "marginal",
    ),
    Metric(
        "mse",
        "feature MSE per feature",
        "the better of a U(0, 1) guess and the best constant (each feature's mean)",
        higher_leaks=False,
        margin=0.1,
        bounded=False,
    ),
    Metric("column_accuracy", "binary feature column accuracy", "the majority value of each column"),
)


def primary(scores: dict[str, Any], n_classes: int) -> tuple[Metric, float, float | None] | None:
    """The leakage metric of an attack's scores: (metric, value, baseline), or None if it reports none."""
    s = {k: v for k, v in scores.items() if isinstance(v, int | float) and math.isfinite(v)}
    cols = [k for k in s if k.endswith("/alg1")]
    if cols:
        base = [s.get(k[: -len("alg1")] + "baseline") for k in cols]
        value = statistics.fmean(s[k] for k in cols)
        return METRICS[-1], value, statistics.fmean(b for b in base if b is not None)
    for m in METRICS[:-1]:
        if m.key not in s:
            continue
        value = float(s[m.key])
        baseline: float | None
        if m.key == "psnr":
            baseline = s.get("psnr_random")  # CAFE reports none: shown without a baseline
        elif m.key == "asr":
            baseline = float(s.get("asr_without_attack", 1.0 / n_classes))
        elif m.key == "label_accuracy":
            # the stronger trivial attacker: always the majority class, or a uniform guess
            baseline = max(float(s.get("majority_baseline", 0.0)), float(s.get("chance", 1.0 / n_classes)))
        elif m.key == "auc":
            baseline = float(s.get("chance_auc", 0.5))
        elif m.key == "cbr":
            found = [s[k] for k in ("cbr_uniform", "cbr_random", "cbr_constant", "cbr_marginal") if k in s]
            baseline = max(found) if found else None  # the strongest trivial attacker
        elif m.key == "mse":
            found = [s[k] for k in ("mse_uniform", "mse_constant") if k in s]
            baseline = min(found) if found else None  # the strongest trivial attacker (lower leaks)
        else:
            baseline = 0.0
        return m, value, None if baseline is None else float(baseline)
    return None


def _baseline_what(metric: Metric, scores: list[dict[str, Any]]) -> str:
    """The baseline in words, as the scores found it (the label attacks' majority class, by name)."""
    majority = {s.get("majority_class") for s in scores} - {None}
    if metric.key == "label_accuracy" and len(majority) == 1:
        return (
            f"the better of always the majority class ({majority.pop()}) on the same samples and a uniform "
            "guess (1 / classes)"
        )
    return metric.baseline


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of the values over the seeds (the value itself for one seed)."""
    mean, half = mean_ci(values)
    if math.isnan(half):
        return mean, mean, mean
    return mean, mean - half, mean + half


def pooled_interval(values: list[float], counts: list[float]) -> tuple[float, float, float]:
    """A rate over samples: the pooled rate of every seed's samples and its 95% Wilson interval."""
    n = sum(counts)
    p = sum(v * c for v, c in zip(values, counts, strict=True)) / n
    z = 1.959963984540054
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, centre - half, centre + half


BLIND = "blind: no informed sample"
UNTESTED = "inconclusive"  # a figure with neither an interval nor a test (one seed of a mean)


def blind(scores: list[dict[str, Any]]) -> bool:
    """Every seed's attack could only guess (``informed_fraction`` 0: e.g. per-sample gradients that arrive
    encrypted under split-he): its figure is a coin's, whatever it reads."""
    return bool(scores) and all(s.get("informed_fraction") == 0 for s in scores)


def verdict(
    metric: Metric,
    low: float,
    high: float,
    mean: float,
    baseline: float | None,
    p: float | None = None,
    family: int = 1,
) -> str:
    """``leaks`` when the whole interval lies beyond the reference (the null's mean, else the baseline),
    the mean beyond it by more than the metric's margin in the leaking direction, and the p-value (Holm's,
    over the ``family`` rows of the audit) below ``ALPHA``; ``inconclusive`` when the mean is beyond but a
    wide interval (few seeds) still reaches the reference, or the corrected p-value is not small enough;
    ``at baseline`` otherwise. (A blind row never gets here.)"""
    if baseline is None:
        return "measured (no baseline)"
    margin = metric.margin if metric.higher_leaks else metric.margin * abs(baseline)
    if metric.higher_leaks:
        beyond, clear = mean - baseline > margin, low > baseline
    else:
        beyond, clear = baseline - mean > margin, high < baseline
    if beyond and clear and (p is None or p < ALPHA):
        return "leaks"
    if beyond and clear:
        over = f" over the audit's {family} tested rows" if family > 1 else ""
        return f"inconclusive (beyond its reference, but p = {p:.3g} after Holm's correction{over})"
    if beyond and (high - low) / 2 > 5 * margin:
        return "inconclusive (a wide interval reaches the baseline: more seeds decide)"
    return "at baseline"


# ------------------------------------------------------------------------------------ the plan
@dataclass
class Setting:
    """No defense, or one defense of ``--defenses`` at every party it can sit at."""

    name: str
    defenses: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""  # why the setting cannot run (the defense does not apply), else ""


@dataclass
class PlannedRun:
    name: str
    setting: str
    seed: int
    group: str  # "taps" or an attack key
    config: dict[str, Any]
    candidates: list[Candidate]

    @property
    def config_path_name(self) -> str:
        return f"{self.name}.yaml"


def defense_settings(spec: str, cfg: Config, base: dict[str, Any], n_classes: int) -> list[Setting]:
    """``--defenses``: a comma list of defense names (each at every party of a role it sits at, default
    parameters) or a YAML file: a list of ``{name, params?, party?}`` or a mapping of setting name to
    such a list."""
    if not spec:
        return []
    path = Path(spec)
    items: list[tuple[str, list[dict[str, Any]]]]
    if path.suffix in (".yaml", ".yml") or path.is_file():
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(str(path), "", f"cannot read the defenses file: {exc}") from exc
        if isinstance(data, dict):
            items = [(str(k), v if isinstance(v, list) else [v]) for k, v in data.items()]
        elif isinstance(data, list):
            items = [(_label(d), [d]) for d in data]
        else:
            raise ConfigError(
                str(path), "", "expected a list of defenses or a mapping of setting -> defenses"
            )
        src = str(path)
    else:
        items = [(n.strip(), [{"name": n.strip()}]) for n in spec.split(",") if n.strip()]
        src = "--defenses"
    out = []
    for label, entries in items:
        if label == "none" or label in [s.name for s in out]:
            raise ConfigError(src, label, "a setting name must be unique and not 'none' (the undefended run)")
        placed: list[dict[str, Any]] = []
        for i, d in enumerate(entries):
            if not isinstance(d, dict) or "name" not in d:
                raise ConfigError(src, f"{label}[{i}]", "a defense is a mapping with a 'name'")
            unknown = sorted(set(d) - {"name", "params", "party"})
            if unknown:
                raise ConfigError(
                    src, f"{label}[{i}]", f"unknown key(s) {unknown}; allowed: name, params, party"
                )
            try:
                cls = DEFENSES.get(d["name"])
            except KeyError as exc:
                raise ConfigError(src, f"{label}[{i}].name", str(exc)) from exc
            parties = [d["party"]] if d.get("party") else _defense_parties(cls, cfg)
            placed += [
                {"name": d["name"], "party": p, "params": dict(d.get("params") or {})} for p in parties
            ]
        setting = Setting(label, placed)
        trial = copy.deepcopy(base)
        trial["defenses"] = list(trial.get("defenses") or []) + placed
        try:
            config_from_dict(trial, src, check_data=True)
            for d in placed:  # as its party builds it (a binary-only defense refuses a 10-class dataset)
                DEFENSES.get(d["name"])(**d["params"]).build(n_classes, 0)
        except ConfigError as exc:
            setting.reason = f"{exc.key}: {exc.message}" if exc.key else exc.message
        except ValueError as exc:
            setting.reason = str(exc)
        if not placed:
            setting.reason = f"{label}: no party of the run can hold it"
        out.append(setting)
    return out


def _label(d: Any) -> str:
    if not isinstance(d, dict):
        return str(d)
    params = ",".join(f"{k}={v}" for k, v in (d.get("params") or {}).items())
    return f"{d.get('name')}({params})" if params else str(d.get("name"))


def _defense_parties(cls: Any, cfg: Config) -> list[str]:
    """Where a defense goes by default: the active party if it can hold it, else every passive party."""
    if "active" in cls.roles and cls.acts_on != "upload":
        return [cfg.active.name]
    return [p.name for p in cfg.parties if p.role in cls.roles]


def run_config(
    base: dict[str, Any], cands: list[Candidate], setting: Setting, seed: int, budget: str, trace: list[str]
) -> dict[str, Any]:
    data = with_entries(base, [c.entry() for c in cands], [g for c in cands for g in c.grants])
    data["defenses"] = list(data.get("defenses") or []) + copy.deepcopy(setting.defenses)
    data.setdefault("run", {})["seed"] = seed
    if budget == "quick":
        train = data.setdefault("train", {})
        train["epochs"] = min(int(train.get("epochs", 5)), QUICK_TRAIN["epochs"])
        steps = int(train.get("max_steps", 0))
        train["max_steps"] = QUICK_TRAIN["max_steps"] if steps == 0 else min(steps, QUICK_TRAIN["max_steps"])
    if trace:
        data["trace"] = {**(data.get("trace") or {}), "parties": sorted(set(trace))}
    return data


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


NULL = "null:"  # the group name's prefix of a null run: "null:FAMILY:GROUP"
# how a null run removes each family's secret at the data level: the config key it sets to the run's seed
NULLS = {"labels": "permute_labels", "features": "resample_features"}
# the secret an attack infers, by what its score is compared with (``Attack.truth_needed``)
FAMILIES = {
    "labels": "labels",
    "images": "features",
    "features": "features",
    "normalized-features": "features",
}


def null_family(cand: Candidate) -> str | None:
    """The secret a null run removes for this attack ("labels", "features"), or None (the backdoor's)."""
    return FAMILIES.get(ATTACKS.get(cand.attack).truth_needed)


def plan_runs(
    base: dict[str, Any],
    cands: list[Candidate],
    settings: list[Setting],
    seeds: list[int],
    budget: str,
    null: bool = False,
) -> list[PlannedRun]:
    """The runs of the audit; with ``null``, each group runs again per seed and per family of the secrets
    its attacks infer, with that secret removed as the parties load their data (``NULLS``: the labels
    permuted among the samples; each passive feature column permuted among the samples, i.e. drawn from
    its marginal; seeded with the run's seed), and is scored against the true data."""
    # an attack whose class scores nothing against ground truth is listed, not run
    run = [c for c in cands if c.applies and c.scored]
    observing = [c for c in run if not c.rewrites and not c.mitm]
    rewriting = [c for c in run if c.rewrites]
    trace = [c.party for c in run if c.mitm]
    runs = []
    for setting in settings:
        if setting.reason:
            continue
        for seed in seeds:
            groups = [("taps", observing, trace)] + [(c.key, [c], []) for c in rewriting]
            if null:
                mitm = [c for c in run if c.mitm]
                groups += [
                    (f"{NULL}{family}:{g}", m, t)
                    for g, m, t in groups
                    for family in NULLS
                    if any(null_family(c) == family for c in m + mitm * (g == "taps"))
                ]
            for group, members, traced in groups:
                config = run_config(base, members, setting, seed, budget, traced)
                if group.startswith(NULL):
                    config.setdefault("data", {})[NULLS[group.split(":")[1]]] = seed
                digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[
                    :8
                ]
                name = slug(f"{setting.name}-{group}-s{seed}-{digest}")
                config["run"]["id"] = name
                runs.append(PlannedRun(name, setting.name, seed, group, config, members))
    return runs


# ------------------------------------------------------------------------------------ running
def execute(runs: list[PlannedRun], out: Path, start: str = "warm") -> dict[str, dict[str, Any]]:
    """Run what is not finished yet; per run name: {"status", "error", "dir"}. Progress on stderr."""
    from vflnet.runner.local import run_local

    configs, runs_dir = out / "configs", out / "runs"
    configs.mkdir(parents=True, exist_ok=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    status: dict[str, dict[str, Any]] = {}
    for i, run in enumerate(runs, 1):
        dest = runs_dir / run.name
        config_path = configs / run.config_path_name
        write_atomic(config_path, yaml.safe_dump(run.config, sort_keys=False))
        tag = f"[{i}/{len(runs)}] {run.setting} / {run.group} / seed {run.seed}"
        if is_completed(dest):
            print(f"{tag}: done before, kept ({dest})", file=sys.stderr)
            status[run.name] = {"status": "completed", "dir": str(dest)}
            continue
        print(f"{tag}: running ({len(run.candidates)} attack(s))", file=sys.stderr, flush=True)
        partial = dest.with_name(dest.name + PARTIAL)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        started = time.monotonic()
        raised = ""
        try:
            rc = run_local(config_path, run_dir=partial, progress=False, start=start)
        except Exception as exc:  # e.g. the launcher's scoring of one attack: the audit scores each alone
            raised = f"{type(exc).__name__}: {exc}"
            print(f"{tag}: the launcher raised {raised}", file=sys.stderr, flush=True)
            rc = 0
        if rc == 130:  # Ctrl-C or SIGTERM stopped the run: the audit stops with it (a rerun resumes)
            raise KeyboardInterrupt
        summary = read_json(partial / "summary.json") if (partial / "summary.json").exists() else {}
        idle = _never_acted(summary)
        if rc == 0 and is_completed(partial):
            complete(partial, dest)
            print(f"{tag}: completed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            status[run.name] = {"status": "completed", "dir": str(dest)}
        elif idle:  # it trained to the end; the rows of what never acted say so, the others are scored
            print(f"{tag}: {summary['error']}", file=sys.stderr, flush=True)
            status[run.name] = {"status": "completed", "dir": str(partial), "never_acted": idle}
        else:
            error = summary.get("error") or raised or f"exit code {rc}"
            print(f"{tag}: FAILED: {error}", file=sys.stderr, flush=True)
            status[run.name] = {"status": "failed", "error": error, "dir": str(partial)}
    return status


def _never_acted(summary: dict[str, Any]) -> dict[str, Any]:
    """A run that trained to the end and failed only because configured entries acted zero times:
    {"attacks": {key: reason}, "defenses": [reasons]}; else empty."""
    effects = summary.get("effects") or {}
    idle = effects.get("never_acted") or {}
    if not idle or "final" not in summary or summary.get("error", "").split(":")[0] != "never acted":
        return {}
    defenses = effects.get("defenses") or {}
    return {
        "attacks": {k: v for k, v in idle.items() if k not in defenses},
        "defenses": [v for k, v in idle.items() if k in defenses],
    }


def per_sample(cand: Candidate, cfg: Config, run_dir: Path) -> dict[str, Any]:
    """What the auditing figures need of a label attack's output, one entry per sample (its first
    observation): an attack with per-sample scores, its informed ``scores`` and whether each sample is
    ``positive``; on a binary task, the ``confusion`` counts [FP, negatives, FN, positives] of its labels.
    A feature attack's per-sample ``errors`` (``Attack.sample_errors``)."""
    import numpy as np

    from vflnet.config import PluginConfig
    from vflnet.runner.scoring import ground_truth
    from vflnet.threat.interception import attack_output_path

    path = attack_output_path(
        run_dir, PluginConfig(name=cand.attack, party=cand.party, params=dict(cand.params))
    )
    if null_family(cand) is None or not path.exists():
        return {}
    with np.load(path) as f:
        output = {k: f[k] for k in f.files}
    cls = ATTACKS.get(cand.attack)
    if null_family(cand) == "features":
        errors = cls.sample_errors(output, ground_truth(cfg, cls.truth_needed, run_dir))
        return {} if errors is None else {"errors": np.asarray(errors, dtype=float).tolist()}
    if "sample_ids" not in output or "labels" not in output or len(output["sample_ids"]) == 0:
        return {}
    truth = ground_truth(cfg, "labels")
    _, first = np.unique(output["sample_ids"], return_index=True)
    ids = output["sample_ids"][first]
    true = np.array([truth[int(i)] for i in ids])
    labels = output["labels"][first]
    positive_label = int(output["positive_label"]) if "positive_label" in output else 1
    out: dict[str, Any] = {}
    if "scores" in output:
        informed = output["informed"][first] if "informed" in output else np.ones(len(ids), dtype=bool)
        out["scores"] = output["scores"][first][informed].astype(float).tolist()
        out["positive"] = (true == positive_label)[informed].tolist()
    if len(set(truth.values())) == 2:
        said, pos = labels == positive_label, true == positive_label
        out["confusion"] = [
            int((said & ~pos).sum()),
            int((~pos).sum()),
            int((~said & pos).sum()),
            int(pos.sum()),
        ]
    return out


LOW_FPR = (0.01, 0.001, 0.0)  # ML Privacy Meter's: TPR at 1%, 0.1% and no false positive


def auditing_figures(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The low-FPR and epsilon figures of a row, its seeds' samples pooled: the ROC of its per-sample
    scores, TPR at 1%, 0.1% and 0% FPR with 95% bootstrap intervals, and from its labels on a binary task
    the empirical epsilon lower bound (Clopper-Pearson, 95%, delta 0) of label differential privacy."""
    import numpy as np

    from vflnet.metrics.auditing import auc, bootstrap, epsilon_lower_bound, roc, tpr_at_fpr

    out: dict[str, Any] = {}
    scores = [v for s in samples for v in s.get("scores", [])]
    positive = np.array([v for s in samples for v in s.get("positive", [])], dtype=bool)
    if scores and positive.any() and not positive.all():
        x = np.array(scores)
        fpr, tpr = roc(x, positive)
        keep = np.unique(np.linspace(0, len(fpr) - 1, min(len(fpr), 200)).astype(int))
        out["roc"] = {
            "fpr": fpr[keep].tolist(),
            "tpr": tpr[keep].tolist(),
            "auc": auc(x, positive),
            "positives": int(positive.sum()),
            "negatives": int((~positive).sum()),
        }
        out["tpr_at_fpr"] = {}
        for target in LOW_FPR:
            low, high = bootstrap(lambda a, b, t=target: tpr_at_fpr(a, b, t), x, positive, resamples=300)
            out["tpr_at_fpr"][f"{target:g}"] = {
                "tpr": tpr_at_fpr(x, positive, target),
                "low": low,
                "high": high,
            }
    confusion = [s["confusion"] for s in samples if s.get("confusion")]
    if confusion:
        fp, neg, fn, pos = (sum(c[i] for c in confusion) for i in range(4))
        if neg and pos:
            out["epsilon_lower_bound"] = {
                "epsilon": epsilon_lower_bound(fp, neg, fn, pos),
                "false_positives": fp,
                "negatives": neg,
                "false_negatives": fn,
                "positives": pos,
                "level": 0.95,
                "delta": 0.0,
            }
    return out


def _collect_null(
    run: PlannedRun, st: dict[str, Any], members: list[Candidate], per: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """A null run's scores of the attacks whose secret it removed, as each row's ``null_scores`` (errors:
    ``null_errors``)."""
    cfg = config_from_dict(run.config, run.name) if st.get("status") == "completed" else None
    run_dir = Path(st.get("dir", ""))
    _, family, group = run.group.split(":", 2)
    for cand in members:
        if null_family(cand) != family or (cand.mitm and group != "taps"):
            continue
        row = per.setdefault((cand.key, run.setting), {"seeds": [], "scores": [], "errors": []})
        if cfg is None:
            row.setdefault("null_errors", []).append(st.get("error", "not run"))
            continue
        s = mitm_scores(run, cand, cfg, run_dir) if cand.mitm else attack_scores(cand, cfg, run_dir)
        if isinstance(s.get("error"), str) or isinstance(s.get("never_acted"), str):
            row.setdefault("null_errors", []).append(s.get("error") or s["never_acted"])
        else:
            row.setdefault("null_scores", []).append(s)
            row.setdefault("null_per_sample", []).append(per_sample(cand, cfg, run_dir))


def attack_scores(cand: Candidate, cfg: Config, run_dir: Path, clean: Path | None = None) -> dict[str, Any]:
    """The attack's own ``score`` of its output against ground truth, in this (launcher) process; a
    failure is that attack's alone (cached in ``attacks/audit-NAME@PARTY.json``).

    An attack scored against the run's predictions (``truth_needed`` with ``predictions``: the
    backdoor's ASR) is also scored against the predictions of ``clean``, the same setting and seed's
    run without it: ``<metric>_without_attack``, the same samples as a model the attack never touched
    classifies them (its baseline)."""
    import numpy as np

    from vflnet.config import PluginConfig
    from vflnet.runner.scoring import score_output
    from vflnet.threat.interception import attack_output_path

    cache = run_dir / "attacks" / f"audit-{cand.attack}@{cand.party}.json"
    if cache.exists():
        return read_json(cache)
    path = attack_output_path(
        run_dir, PluginConfig(name=cand.attack, party=cand.party, params=dict(cand.params))
    )
    if not path.exists():
        return {"error": f"no output ({path.name})"}
    with np.load(path) as f:
        output = {k: f[k] for k in f.files}
    try:
        scores = score_output(cfg, cand.attack, output, run_dir)
        if clean is not None and "predictions" in ATTACKS.get(cand.attack).truth_needed:
            without = score_output(cfg, cand.attack, output, clean)
            scores.update({f"{k}_without_attack": v for k, v in without.items() if k in PAIRED})
    except Exception as exc:  # noqa: BLE001 - reported in the attack's row
        scores = {"error": f"scoring failed: {type(exc).__name__}: {exc}"}
    write_atomic(cache, json.dumps(scores, indent=2, default=float))
    return scores


def mitm_scores(run: PlannedRun, cand: Candidate, cfg: Config, run_dir: Path) -> dict[str, Any]:
    """The attack offline over the trace of the party whose channel a man in the middle reads (cached)."""
    from vflnet.interceptors.trace import read_trace, trace_path
    from vflnet.runner.scoring import score_output
    from vflnet.threat.attack import AttackContext

    cache = run_dir / "attacks" / f"mitm-{cand.attack}@{cand.party}.json"
    if cache.exists():
        return read_json(cache)
    attack = ATTACKS.get(cand.attack)(
        AttackContext(cand.party, cfg.party(cand.party).role, cfg.run.id, {}), **cand.params
    )
    try:
        events = list(read_trace(trace_path(run_dir, cand.party)))
        if not any(t.matches(e) for e in events for t in attack.taps):
            return {"never_acted": f"no message of {cand.party}'s trace matches the taps of {cand.attack}"}
        scores = score_output(cfg, cand.attack, attack.run(events), run_dir)
    except Exception as exc:  # noqa: BLE001 - reported in the attack's row
        scores = {"error": f"offline over the trace: {type(exc).__name__}: {exc}"}
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cache, json.dumps(scores, indent=2, default=float))
    return scores


def collect(
    runs: list[PlannedRun], status: dict[str, dict[str, Any]], cands: list[Candidate], n_classes: int
) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, dict[str, Any]]]:
    """Per (attack key, setting): the per-seed scores, the metric, mean, interval, baseline and verdict;
    per setting: main-task accuracy and wall time (means over the seeds' observing runs)."""
    per: dict[tuple[str, str], dict[str, Any]] = {}
    utility: dict[str, dict[str, Any]] = {}
    clean = {  # (setting, seed) -> the observing run's directory: the run without any rewriting attack
        (r.setting, r.seed): Path(status[r.name]["dir"])
        for r in runs
        if r.group == "taps" and status.get(r.name, {}).get("status") == "completed"
    }
    for run in runs:
        st = status.get(run.name, {})
        run_dir = Path(st.get("dir", ""))
        members = list(run.candidates)
        if run.group.startswith(NULL):
            _collect_null(run, st, members + [c for c in cands if c.applies and c.scored and c.mitm], per)
            continue
        if run.group == "taps":
            members += [c for c in cands if c.applies and c.scored and c.mitm]
            u = utility.setdefault(run.setting, {"test_accuracy": [], "wall_time_s": [], "errors": []})
            if st.get("status") == "completed":
                summary = read_json(run_dir / "summary.json")
                acc = (summary.get("final") or {}).get("test_accuracy")
                if acc is not None:
                    u["test_accuracy"].append(float(acc))
                u["wall_time_s"].append(float(summary.get("wall_time_s") or 0.0))
            else:
                u["errors"].append(st.get("error", "not run"))
        cfg = config_from_dict(run.config, run.name) if st.get("status") == "completed" else None
        for cand in members:
            row = per.setdefault((cand.key, run.setting), {"seeds": [], "scores": [], "errors": []})
            if st.get("status") != "completed":
                row["errors"].append(st.get("error", "not run"))
                continue
            assert cfg is not None
            idle = st.get("never_acted") or {}
            why = list(idle.get("defenses", []))  # a defense of its run that never acted fails every row
            if not cand.mitm and cand.entry_key in idle.get("attacks", {}):
                why.append(idle["attacks"][cand.entry_key])
            if why:
                row.setdefault("never_acted", []).append("; ".join(why))
                continue
            if cand.mitm:
                s = mitm_scores(run, cand, cfg, run_dir)
            else:
                without = clean.get((run.setting, run.seed)) if run.group != "taps" else None
                s = attack_scores(cand, cfg, run_dir, without)
            if isinstance(s.get("never_acted"), str):
                row.setdefault("never_acted", []).append(s["never_acted"])
                continue
            if isinstance(s.get("error"), str):
                row["errors"].append(s["error"])
                continue
            row["seeds"].append(run.seed)
            row["scores"].append(s)
            # a man in the middle's samples: the same attack's output at the party whose channel it reads (the
            # same traffic, run online in the same run)
            row.setdefault("per_sample", []).append(per_sample(cand, cfg, run_dir))
            row.setdefault("run_dirs", []).append(str(run_dir))
            row.setdefault("configs", []).append(run.name)
    for cand in cands:
        if cand.applies and not cand.scored:
            for setting in {r.setting for r in runs} | {"none"}:
                per[(cand.key, setting)] = {
                    "seeds": [],
                    "scores": [],
                    "errors": [],
                    "verdict": "no leakage metric: its score compares nothing with ground truth (not run)",
                }
    for row in per.values():
        judge(row, n_classes)
    correct(list(per.values()))
    for u in utility.values():
        u["mean_test_accuracy"] = statistics.fmean(u["test_accuracy"]) if u["test_accuracy"] else None
        u["mean_wall_time_s"] = statistics.fmean(u["wall_time_s"]) if u["wall_time_s"] else None
    return per, utility


def judge(row: dict[str, Any], n_classes: int) -> None:
    """A row's metric, mean, interval, baseline and verdict, from its per-seed scores and errors (in place)."""
    samples = row.pop("per_sample", [])  # for the figures and tests only: never in audit.json
    null_samples = row.pop("null_per_sample", [])
    if row.get("never_acted"):  # in any seed: what it scored elsewhere is not its leak
        row["verdict"] = f"{NEVER_ACTED} ({row['never_acted'][0]})"
        return
    if not row.get("scores") and "verdict" in row:
        return
    if row["errors"]:  # a run or scoring failure in any seed: what the others scored is no verdict
        runs = len(row["errors"]) + len(row["scores"])
        row["verdict"] = f"failed: {row['errors'][0]}" + (
            f" ({len(row['errors'])} of {runs} runs)" if runs > 1 else ""
        )
        return
    measured = [(primary(s, n_classes), s) for s in row["scores"]]
    found = [f for f, _ in measured if f is not None]
    scored = [s for f, s in measured if f is not None]
    if not found:
        row["verdict"] = "no leakage metric in its scores: " + ", ".join(
            f"{k}={v:g}" if isinstance(v, int | float) else k for k, v in list(row["scores"][0].items())[:4]
        )
        return
    metric = found[0][0]
    values = [f[1] for f in found]
    baselines = [f[2] for f in found if f[2] is not None]
    counts = [s.get(metric.count) for s in scored] if metric.count else []
    pooled = len(counts) == len(values) and all(isinstance(c, int | float) and c > 0 for c in counts)
    mean, low, high = pooled_interval(values, counts) if pooled else interval(values)
    baseline = statistics.fmean(baselines) if baselines else None
    if pooled and len(baselines) == len(values):  # weighed like the values it is compared with
        baseline = sum(b * c for b, c in zip(baselines, counts, strict=True)) / sum(counts)
    if metric.bounded:  # a rate: the t-interval of few seeds can reach past [0, 1]
        low, high = max(low, 0.0), min(high, 1.0)
    row.update(
        metric=metric.key,
        metric_what=metric.what,
        baseline_what=_baseline_what(metric, scored),
        values=values,
        interval="Wilson, the seeds' samples pooled" if pooled else "t over the seeds",
        samples=sum(counts) if pooled else None,
        mean=mean,
        low=low,
        high=high,
        baseline=baseline,
    )
    row.update(_null(metric, row, n_classes))
    row.update(auditing_figures(samples))
    row["p_value"], row["test"] = p_value(
        metric, values, counts if pooled else [], row, samples, null_samples
    )
    if blind(scored):
        row["verdict"] = f"{BLIND} (informed fraction 0 in every seed: it could only guess)"
    elif row["p_value"] is None and len(values) < 2 and not pooled:
        row["verdict"] = f"{UNTESTED} (one seed, and no test of its samples: more seeds decide)"
    else:
        row["verdict"] = verdict(metric, low, high, mean, _reference(row), row["p_value"])


def _reference(row: dict[str, Any]) -> float | None:
    """What the row is compared with: the null's mean where it has a null, else the baseline."""
    return row["null_mean"] if row.get("null_mean") is not None else row.get("baseline")


def _null(metric: Metric, row: dict[str, Any], n_classes: int) -> dict[str, Any]:
    """The null runs' figures of the row's metric: per-seed values, their pooled mean and counts."""
    if row.get("null_errors"):
        return {"null_error": row["null_errors"][0]}
    found = [(primary(s, n_classes), s) for s in row.get("null_scores", [])]
    pairs = [(f[1], s.get(metric.count)) for f, s in found if f is not None and f[0] == metric]
    if not pairs:
        return {}
    values = [v for v, _ in pairs]
    counts = [c for _, c in pairs]
    if metric.count and all(isinstance(c, int | float) and c > 0 for c in counts):
        mean = sum(v * c for v, c in pairs) / sum(counts)
        return {"null_values": values, "null_mean": mean, "null_samples": sum(counts)}
    return {"null_values": values, "null_mean": statistics.fmean(values)}


def p_value(
    metric: Metric,
    values: list[float],
    counts: list[float],
    row: dict[str, Any],
    samples: list[dict[str, Any]] = (),  # type: ignore[assignment]
    null_samples: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> tuple[float | None, str]:
    """The one-sided p-value that the row leaks no more than its reference, and the test that gave it.
    Against its null runs: Fisher's exact test of the pooled counts (a rate), a bootstrap of the pooled AUC
    against the null's (a leak AUC with per-sample scores), the Mann-Whitney test of the per-sample errors
    against the null's (a feature MSE), else the empirical p over the null's seeds.
    Against the baseline: an exact binomial test of the pooled counts, the Mann-Whitney test that the
    positives' per-sample scores exceed the negatives' (a leak AUC), else a one-sample t-test over the
    seeds. None where there is nothing to test with."""
    from scipy.stats import binomtest, fisher_exact, mannwhitneyu, ttest_1samp

    from vflnet.metrics.auditing import empirical_p

    side = "greater" if metric.higher_leaks else "less"
    hits = round(sum(v * c for v, c in zip(values, counts, strict=True))) if counts else 0
    scores, null_scores = _pooled_scores(samples), _pooled_scores(null_samples)
    if row.get("null_values"):
        if counts and row.get("null_samples"):
            n0 = int(row["null_samples"])
            k0 = round(row["null_mean"] * n0)
            table = [[hits, int(sum(counts)) - hits], [k0, n0 - k0]]
            found = float(fisher_exact(table, alternative=side).pvalue)
            return found, "Fisher's exact test against the null runs"
        if metric.key == "auc" and scores and null_scores:
            return auc_difference_p(scores, null_scores), "bootstrap of the pooled AUC against the null runs'"
        errors = [v for s in samples for v in s.get("errors", [])]
        null_errors = [v for s in null_samples for v in s.get("errors", [])]
        if metric.key == "mse" and errors and null_errors:
            found = float(mannwhitneyu(errors, null_errors, alternative="less").pvalue)
            return found, "Mann-Whitney U of the per-sample errors against the null runs'"
        found = empirical_p(statistics.fmean(values), row["null_values"], metric.higher_leaks)
        return found, "empirical, over the null runs' seeds"
    baseline = row.get("baseline")
    if baseline is None:
        return None, ""
    if metric.key == "auc" and baseline == 0.5 and scores:
        pos = [v for v, p in scores if p]
        neg = [v for v, p in scores if not p]
        return float(
            mannwhitneyu(pos, neg, alternative="greater").pvalue
        ), "Mann-Whitney U, the samples pooled"
    if counts:
        n = int(sum(counts))
        found = float(binomtest(hits, n, min(max(baseline, 0.0), 1.0), alternative=side).pvalue)
        return found, "exact binomial test against the baseline"
    if len(values) < 2:
        return None, ""
    if statistics.pstdev(values) == 0:  # the same value in every seed: a t-test has no variance to use
        beyond = values[0] > baseline if metric.higher_leaks else values[0] < baseline
        return (0.0 if beyond else 1.0), "every seed on the same side of the baseline (no variance)"
    found = float(ttest_1samp(values, baseline, alternative=side).pvalue)
    return found, "one-sample t-test against the baseline"


def _pooled_scores(samples: list[dict[str, Any]]) -> list[tuple[float, bool]]:
    """The seeds' per-sample (score, positive) pooled; empty unless both classes are there."""
    pairs = [(v, p) for s in samples for v, p in zip(s.get("scores", []), s.get("positive", []), strict=True)]
    return pairs if 0 < sum(p for _, p in pairs) < len(pairs) else []


def auc_difference_p(
    scores: list[tuple[float, bool]], null: list[tuple[float, bool]], resamples: int = 1000
) -> float:
    """One-sided bootstrap p-value that the pooled AUC of ``scores`` is no higher than that of ``null``:
    (1 + resamples whose difference is <= 0) / (1 + resamples), both sets resampled (seeded)."""
    import numpy as np

    from vflnet.metrics.auditing import auc

    rng = np.random.default_rng(0)
    x, px = np.array([v for v, _ in scores]), np.array([p for _, p in scores])
    y, py = np.array([v for v, _ in null]), np.array([p for _, p in null])
    below = done = 0
    while done < resamples:
        i, j = rng.integers(0, len(x), len(x)), rng.integers(0, len(y), len(y))
        if px[i].all() or not px[i].any() or py[j].all() or not py[j].any():
            continue
        below += int(auc(x[i], px[i]) - auc(y[j], py[j]) <= 0)
        done += 1
    return (1 + below) / (1 + resamples)


ALPHA = 0.05  # the family-wise error rate of one audit's "leaks" verdicts (Holm)


def correct(rows: list[dict[str, Any]]) -> None:
    """Holm's correction over every row of one audit that has a p-value: ``p_holm``, and the verdicts
    again with it (a row that leaks by its own test but not after the correction is inconclusive)."""
    from vflnet.metrics.auditing import holm

    tested = [r for r in rows if r.get("p_value") is not None and "metric" in r]
    for r, adjusted in zip(tested, holm([r["p_value"] for r in tested]), strict=True):
        r["p_holm"] = adjusted
        if r["verdict"].startswith(BLIND):
            continue
        metric = next(m for m in METRICS if m.key == r["metric"])
        r["verdict"] = verdict(metric, r["low"], r["high"], r["mean"], _reference(r), adjusted, len(tested))
