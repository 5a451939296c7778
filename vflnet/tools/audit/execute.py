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
the metric's baseline (``METRICS``): the mean over seeds with a 95% t-interval.
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
    Metric("label_accuracy", "label accuracy", "chance, 1 / classes", count="samples"),
    Metric("cbr", "correct branching rate", "a U(0, 1) guess"),
    Metric(
        "mse", "feature MSE per feature", "a U(0, 1) guess", higher_leaks=False, margin=0.1, bounded=False
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
            baseline = float(s.get("chance", 1.0 / n_classes))
        elif m.key == "auc":
            baseline = float(s.get("chance_auc", 0.5))
        elif m.key == "cbr":
            baseline = s.get("cbr_uniform", s.get("cbr_random"))
        elif m.key == "mse":
            baseline = s.get("mse_uniform")
        else:
            baseline = 0.0
        return m, value, None if baseline is None else float(baseline)
    return None


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


def verdict(metric: Metric, low: float, high: float, mean: float, baseline: float | None) -> str:
    """``leaks`` when the whole interval lies beyond the baseline and the mean beyond it by more than the
    metric's margin, in the leaking direction; ``inconclusive`` when the mean does but a wide interval
    (few seeds) still reaches the baseline; ``at baseline`` otherwise."""
    if baseline is None:
        return "measured (no baseline)"
    margin = metric.margin if metric.higher_leaks else metric.margin * abs(baseline)
    if metric.higher_leaks:
        beyond, clear = mean - baseline > margin, low > baseline
    else:
        beyond, clear = baseline - mean > margin, high < baseline
    if beyond and clear:
        return "leaks"
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


def plan_runs(
    base: dict[str, Any], cands: list[Candidate], settings: list[Setting], seeds: list[int], budget: str
) -> list[PlannedRun]:
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
            for group, members, traced in groups:
                config = run_config(base, members, setting, seed, budget, traced)
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
        if row.get("never_acted"):  # in any seed: what it scored elsewhere is not its leak
            row["verdict"] = f"{NEVER_ACTED} ({row['never_acted'][0]})"
            continue
        if not row.get("scores") and "verdict" in row:
            continue
        measured = [(primary(s, n_classes), s) for s in row["scores"]]
        found = [f for f, _ in measured if f is not None]
        scored = [s for f, s in measured if f is not None]
        if not found:
            row["verdict"] = (
                f"failed: {row['errors'][0]}"
                if row["errors"] and not row["scores"]
                else "no leakage metric in its scores: "
                + ", ".join(
                    f"{k}={v:g}" if isinstance(v, int | float) else k
                    for k, v in list(row["scores"][0].items())[:4]
                )
            )
            continue
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
            baseline_what=metric.baseline,
            values=values,
            interval="Wilson, the seeds' samples pooled" if pooled else "t over the seeds",
            samples=sum(counts) if pooled else None,
            mean=mean,
            low=low,
            high=high,
            baseline=baseline,
            verdict=verdict(metric, low, high, mean, baseline),
        )
        if row["errors"]:  # some seeds failed: the verdict stands on the others, and says so
            row["verdict"] += (
                f" ({len(row['errors'])} of {len(row['errors']) + len(values)} runs failed: {row['errors'][0]})"
            )
    for u in utility.values():
        u["mean_test_accuracy"] = statistics.fmean(u["test_accuracy"]) if u["test_accuracy"] else None
        u["mean_wall_time_s"] = statistics.fmean(u["wall_time_s"]) if u["wall_time_s"] else None
    return per, utility
