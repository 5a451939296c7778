"""The audit's report: Markdown, one self-contained HTML page (vflnet.tools.experiments.document) and JSON.

Per attack and position: the threat model in one sentence (who, what it sees, what it is granted),
what leaked against the baseline (mean and 95% interval over the seeds), the verdict ("leaks", "at
baseline", "not applicable: why"), the paper it comes from and the command that reproduces the row.
With defenses: per setting the main task's accuracy and time, each attack's leakage, and VFLAIR's
defense capability score (vflnet.tools.experiments.capability).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from vflnet.config import Config
from vflnet.registry import ATTACKS, DEFENSES
from vflnet.tools.audit.execute import NEVER_ACTED, NULL, PlannedRun, Setting
from vflnet.tools.audit.selection import Candidate
from vflnet.tools.experiments import capability
from vflnet.tools.experiments.document import Block, Code, Figure, Heading, Table, Text, write

# The papers vflnet implements (docs/architecture.md, "The papers"), by the number attacks cite them with.
PAPERS = {
    "000": "Ye et al., feature reconstruction from first-layer outputs",
    "001": "Qiu et al., HashVFL",
    "002": "Jin et al., CAFE",
    "003": "Luo et al., feature inference attacks on model predictions",
    "004": "Zou et al., batch-level label inference and CAE/DCAE",
}


def paper(attack: str) -> str:
    """The paper an attack cites in its description or its module's docstring (first mention)."""
    cls = ATTACKS.get(attack)
    module = sys.modules.get(cls.__module__)
    text = f"{cls.description} {getattr(module, '__doc__', '') or ''}"
    found = re.search(r"[Pp]aper (00\d)", text)
    if found:
        return f"paper {found.group(1)}: {PAPERS.get(found.group(1), '')}".rstrip(": ")
    other = re.search(r"\(([A-Z][a-z]+ et al\.[^)]*)\)", text)
    return other.group(1) if other else "-"


def _tapped(t: Any) -> str:
    if t.side == "client":
        what = "it sends" if t.direction == "request" else "it gets back"
    else:
        what = "it receives" if t.direction == "request" else "it answers"
    return f"the {t.method} {t.direction}s {what}"


def threat_model(cand: Candidate) -> str:
    """Who, what it sees, what it changes, what it is granted: one sentence."""
    cls = ATTACKS.get(cand.attack)
    who = cand.position[0].upper() + cand.position[1:]
    sees = [_tapped(t) for t in cls.taps]
    kinds = [k for k, _, _ in cand.knowledge]
    if "own_view" in kinds:
        sees.append("its own rows, bottom model and gradient of each training step")
    if "predictions" in kinds:
        sees.append("the confidence vectors of the prediction phase")
    sentence = f"{who} sees {', '.join(sees) if sees else 'nothing else on the wire'}"
    changes = [_tapped(t) for t in cls.rewrites]
    if cls.changes_own_data:
        changes.append("its own training rows")
    if changes:
        sentence += f"; it rewrites {', '.join(changes)}"
    granted = [
        f"{k} ({standing})" for k, _, standing in cand.knowledge if k not in ("own_view", "predictions")
    ]
    return sentence + (f"; granted: {', '.join(granted)}." if granted else "; granted nothing beyond that.")


DCS_METRICS = ("label_accuracy", "asr", "auc", "cbr", "column_accuracy")


def short(verdict: str) -> str:
    """A verdict without its explanation: leaks, at baseline, inconclusive, failed, failed: never acted, ..."""
    if verdict.startswith(NEVER_ACTED):
        return NEVER_ACTED
    return verdict.split(" (")[0].split(":")[0]


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def null_cell(row: dict[str, Any]) -> str:
    """The null runs' mean of the row's metric (or why there is none)."""
    if row.get("null_error"):
        return f"failed: {row['null_error']}"
    return fmt(row.get("null_mean")) if row.get("null_mean") is not None else "-"


def p_cell(row: dict[str, Any]) -> str:
    """The row's one-sided p-value and, in parentheses, Holm's over the audit's tested rows."""
    if row.get("p_value") is None:
        return "-"
    return f"{row['p_value']:.2g} ({row.get('p_holm', row['p_value']):.2g})"


def _ci(f: dict[str, float]) -> str:
    return f"{fmt(f['tpr'])} [{fmt(f['low'])}, {fmt(f['high'])}]"


def low_fpr_blocks(
    applicable: list[Candidate], settings: list[Setting], per: dict[tuple[str, str], dict[str, Any]]
) -> list[Block]:
    """The privacy-auditing figures of the rows that have them: per row and setting the pooled ROC's
    AUC, TPR at 1%, 0.1% and 0% FPR with bootstrap intervals, the epsilon lower bound; one ROC plot per row."""
    from vflnet.tools.experiments import figures

    lines: list[list[str]] = []
    plots: list[Block] = []
    for c in applicable:
        if c.mitm:
            continue  # the figures of the same attack at its party (audit.json has them in its row too)
        curves = {}
        for s in settings:
            r = per.get((c.key, s.name), {})
            if "roc" not in r and "epsilon_lower_bound" not in r:
                continue
            roc, at, eps = r.get("roc"), r.get("tpr_at_fpr", {}), r.get("epsilon_lower_bound")
            lines.append(
                [
                    f"{c.attack} @ {c.position}",
                    s.name,
                    fmt(roc["auc"]) if roc else "-",
                    _ci(at["0.01"]) if "0.01" in at else "-",
                    _ci(at["0.001"]) if "0.001" in at else "-",
                    _ci(at["0"]) if "0" in at else "-",
                    f"{roc['positives']} / {roc['negatives']}" if roc else "-",
                    f"{eps['epsilon']:.2f} ({eps['false_positives']}/{eps['negatives']} FP, "
                    f"{eps['false_negatives']}/{eps['positives']} FN)"
                    if eps
                    else "-",
                ]
            )
            if roc:
                curves[s.name] = (roc["fpr"], roc["tpr"])
        if curves:
            plots.append(
                Figure(
                    f"roc-{c.key}", figures.roc_curves(curves, f"{c.attack} @ {c.position}"), f"ROC: {c.key}"
                )
            )
    if not lines:
        return []
    return [
        Heading("Low-FPR and epsilon figures"),
        Text(
            "For the label attacks with per-sample scores: the ROC of the seeds' samples pooled (each sample "
            "once, its informed scores), TPR at 1%, 0.1% and 0% FPR with 95% bootstrap intervals (with fewer than "
            "1,000 negatives TPR at 0.1% FPR is TPR at no false positive). On a binary task, from the attack's "
            "own labels: the empirical epsilon lower bound of label differential privacy (Clopper-Pearson at "
            "95%, delta 0; its assumptions in docs/audit.md)."
        ),
        Table(
            [
                "attack",
                "setting",
                "AUC (pooled)",
                "TPR at 1% FPR [95%]",
                "TPR at 0.1% FPR [95%]",
                "TPR at 0% FPR [95%]",
                "positives / negatives",
                "epsilon lower bound",
            ],
            lines,
        ),
        *plots,
    ]


def along(points: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One ``--vary`` axis: per value its audit's folder (or why it was refused), the main task's accuracy,
    and per attack position its metric's mean and verdict (None where it was not applicable)."""
    keys: dict[str, str] = {}
    for _, result in points:
        for r in result.get("applicable", []):
            keys.setdefault(f"{r['attack']} @ {r['position']}", r["by_setting"]["none"].get("metric", ""))
    rows: dict[str, dict[str, Any]] = {}
    for name, metric in keys.items():
        if not metric:
            continue  # no leakage metric at any value: nothing to plot
        means, verdicts = [], []
        for _, result in points:
            found = next(
                (
                    r["by_setting"]["none"]
                    for r in result.get("applicable", [])
                    if f"{r['attack']} @ {r['position']}" == name
                ),
                None,
            )
            means.append(found.get("mean") if found and found.get("metric") == metric else None)
            verdicts.append(found.get("verdict", "not run") if found else "not applicable")
        rows[name] = {"metric": metric, "means": means, "verdicts": verdicts}
    return {
        "values": [v for v, _ in points],
        "audits": [str(Path(r["report"]["html"]).parent) if "report" in r else None for _, r in points],
        "refused": [r.get("refused") for _, r in points],
        "test_accuracy": [
            (r.get("utility", {}).get("none") or {}).get("mean_test_accuracy") for _, r in points
        ],
        "rows": rows,
    }


def vary_blocks(vary: dict[str, Any]) -> list[Block]:
    """Per ``--vary`` axis: a table of every attack's metric and verdict and the main task's accuracy at
    each value, and the plot of the metrics along the axis beside the accuracy."""
    from vflnet.tools.experiments import figures

    blocks: list[Block] = []
    for key, axis in vary.items():
        values = axis["values"]
        table = [["main-task accuracy", *(fmt(a) for a in axis["test_accuracy"])]]
        table += [
            [
                f"{name}: {r['metric']}",
                *(
                    f"{fmt(m)}: {short(v)}" if m is not None else short(v)
                    for m, v in zip(r["means"], r["verdicts"], strict=True)
                ),
            ]
            for name, r in axis["rows"].items()
        ]
        if any(axis["refused"]):
            table.append(["refused", *(r or "-" for r in axis["refused"])])
        table.append(["audit", *(a or "-" for a in axis["audits"])])
        series = {name: r["means"] for name, r in axis["rows"].items()}
        blocks += [
            Heading(f"Along {key}"),
            Text(
                f"The same audit at each value of `{key}` (the other keys as configured): every attack's "
                "metric (its mean over the seeds) and verdict, and the main task's test accuracy."
            ),
            Table([key, *values], table),
            Figure(
                f"vary-{re.sub(r'[^A-Za-z0-9_.-]+', '-', key)}",
                figures.along_axis(key, values, series, axis["test_accuracy"]),
                f"leakage along {key}",
            ),
        ]
    return blocks


def tradeoff_figure(
    applicable: list[Candidate],
    settings: list[Setting],
    per: dict[tuple[str, str], dict[str, Any]],
    mtas: list[float | None],
) -> list[Block]:
    """The trade-off plot: per attack position with a metric under two or more settings, each setting's
    (metric, main-task accuracy)."""
    from vflnet.tools.experiments import figures

    points: dict[str, list[tuple[str, float, float]]] = {}
    for c in applicable:
        if c.mitm:
            continue  # the same figures as the attack at its party
        got = [
            (s.name, per[(c.key, s.name)]["mean"], mp)
            for s, mp in zip(settings, mtas, strict=True)
            if mp is not None and "mean" in per.get((c.key, s.name), {})
        ]
        if len(got) > 1:
            points[f"{c.attack}@{c.party} ({per[(c.key, got[0][0])]['metric']})"] = got
    if not points:
        return []
    return [Figure("defense-tradeoff", figures.defense_tradeoff(points), "defenses: utility against leakage")]


def noise_line(s: Setting) -> str:
    """A defense setting's configured parameters (its noise), and the epsilon it claims where it has one."""
    parts = []
    for d in s.defenses:
        params = {**{k: p.default for k, p in DEFENSES.get(d["name"]).params.items()}, **d["params"]}
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        claimed = [f"{k}={v}" for k, v in params.items() if "epsilon" in k]
        parts.append(
            f"{d['name']}({shown})" + (f"; its accountant's epsilon: {', '.join(claimed)}" if claimed else "")
        )
    return "; ".join(dict.fromkeys(parts)) or "-"


def reproduce_command(cand: Candidate, row: dict[str, Any], out: Path) -> str:
    """The command that reproduces the row alone (its first seed)."""
    if not row.get("configs"):
        return "-"
    first = row["configs"][0]
    if cand.mitm:
        run_dir = Path(row["run_dirs"][0])
        return (
            f"vflnet attack {cand.attack} --trace {run_dir}/traces/{cand.party}.trace "
            f"--config {out}/configs/{first}.yaml --run-dir {run_dir}"
        )
    return f"vflnet run {out}/rows/{row['row_config']}"


def build(
    out: Path,
    source: str,
    cfg: Config,
    budget: str,
    seeds: list[int],
    cands: list[Candidate],
    settings: list[Setting],
    runs: list[PlannedRun],
    per: dict[tuple[str, str], dict[str, Any]],
    utility: dict[str, dict[str, Any]],
    notes: list[str],
    varied: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    applicable = [c for c in cands if c.applies]
    skipped = [c for c in cands if not c.applies]
    rows_json = []
    verdict_rows = []
    for cand in applicable:
        row = per.get((cand.key, "none"), {})
        verdict = row.get("verdict", "not run")
        interval = f"{fmt(row['mean'])} [{fmt(row['low'])}, {fmt(row['high'])}]" if "mean" in row else "-"
        command = reproduce_command(cand, row, out)
        verdict_rows.append(
            [
                cand.attack,
                cand.position,
                threat_model(cand),
                row.get("metric_what", "-"),
                interval,
                f"{fmt(row.get('baseline'))} ({row['baseline_what']})" if "baseline_what" in row else "-",
                null_cell(row),
                p_cell(row),
                verdict,
                paper(cand.attack),
                command,
            ]
        )
        rows_json.append(
            {
                "attack": cand.attack,
                "party": cand.party,
                "position": cand.position,
                "man_in_the_middle": cand.mitm,
                "threat_model": threat_model(cand),
                "knowledge": [{"kind": k, "what": w, "standing": s} for k, w, s in cand.knowledge],
                "params": cand.params,
                "paper": paper(cand.attack),
                "reproduce": command,
                "by_setting": {
                    s.name: {k: v for k, v in per.get((cand.key, s.name), {}).items() if k != "configs"}
                    for s in settings
                },
            }
        )
    skipped_rows = [[c.attack, c.position, f"not applicable: {c.reason}"] for c in skipped]

    blocks: list[Block] = [
        Text(
            f"Audit of `{source}`: protocol `{cfg.protocol.kind}`, dataset `{cfg.data.dataset}`, "
            f"{len(cfg.parties) - 1} parties and a coordinator, transport TLS "
            f"{'on' if cfg.transport.tls.enabled else 'off (plaintext)'}, bridge `{cfg.transport.bridge}`. "
            f"Budget `{budget}`: seeds {', '.join(map(str, seeds))}; {len(runs)} runs. "
            f"{len(applicable)} attack positions apply, {len(skipped)} do not."
        ),
    ]
    blocks += [Text(n) for n in notes]
    blocks += [
        Heading("Verdicts"),
        Text(
            "Each applicable attack, scored with its own score against ground truth after the run, against "
            "the baseline of an attacker without the leak. The value is the mean over the seeds with a 95% "
            "interval: for a rate over samples (label accuracy, ASR) the Wilson interval of every seed's "
            "samples pooled, otherwise the t-interval over the seeds. 'leaks': the whole interval lies beyond "
            "the baseline (or the null), the mean by more than a practical margin, and the p-value after "
            "Holm's correction over every tested row of this audit is below 0.05. The null is the same runs "
            "with the labels permuted among the samples (`--null`); p is one-sided (the test is named in "
            "audit.json). Every verdict is defined in docs/audit.md."
        ),
        Table(
            [
                "attack",
                "position",
                "threat model",
                "metric",
                "value [95% interval]",
                "baseline",
                "null (labels permuted)",
                "p (Holm)",
                "verdict",
                "paper",
                "reproduce",
            ],
            verdict_rows,
        ),
        *low_fpr_blocks(applicable, settings, per),
        Heading("Not applicable"),
        Table(["attack", "position", "verdict"], skipped_rows),
    ]
    assumed = sorted({(k, w, s) for c in applicable for k, w, s in c.knowledge if s != "provided by the run"})
    if assumed:
        blocks += [
            Heading("Assumptions"),
            Text("What the threat models grant beyond the run (each is stated per attack above):"),
            Table(["knowledge", "what", "standing"], [list(a) for a in assumed]),
        ]
    dcs_json: dict[str, Any] = {}
    if len(settings) > 1:
        header = ["", *(s.name for s in settings)]
        mtas = [utility.get(s.name, {}).get("mean_test_accuracy") for s in settings]
        table = [
            [
                "defense",
                *(", ".join(f"{d['name']}@{d['party']}" for d in s.defenses) or "-" for s in settings),
            ],
            ["configured parameters", *(noise_line(s) for s in settings)],
            [
                "main-task accuracy",
                *(fmt(m) if not s.reason else "-" for s, m in zip(settings, mtas, strict=True)),
            ],
            [
                "time per run (s)",
                *(fmt(utility.get(s.name, {}).get("mean_wall_time_s"), 1) for s in settings),
            ],
        ]
        if any(s.reason for s in settings):
            table.append(["not applicable", *(s.reason or "-" for s in settings)])
        for c in applicable:
            if not any("mean" in per.get((c.key, s.name), {}) for s in settings):
                continue
            line = [f"{c.attack} @ {c.position}"]
            for s, mp in zip(settings, mtas, strict=True):
                r = per.get((c.key, s.name), {})
                ap = r.get("mean")
                if s.reason or ap is None:
                    line.append("-" if s.reason else short(r.get("verdict", "-")))
                    continue
                cell = f"{r['metric']} {fmt(ap)}: {short(r['verdict'])}"
                if "epsilon_lower_bound" in r:
                    cell += f"; epsilon >= {r['epsilon_lower_bound']['epsilon']:.2f}"
                if mp is not None and r.get("metric") in DCS_METRICS:
                    dcs = capability.defense_capability_score(min(max(ap, 0.0), 1.0), mp)
                    dcs_json.setdefault(s.name, {})[c.key] = dcs
                    cell += f"; DCS {fmt(dcs)}"
                line.append(cell)
            table.append(line)
        blocks += [
            Heading("Defenses: utility and leakage"),
            Text(
                "One column per setting: the main task's test accuracy and the wall time of a run (means over "
                "the seeds), then each attack's metric and verdict under that setting, and VFLAIR's defense "
                "capability score (DCS; beta 0.5, ideal: attack 0, main task 1) for attacks whose metric is a "
                "rate in [0, 1]."
            ),
            Table(header, table),
            *tradeoff_figure(applicable, settings, per, mtas),
        ]
    vary_json = {key: along(points) for key, points in varied}
    blocks += vary_blocks(vary_json)
    blocks += [
        Heading("Runs"),
        Table(
            ["run", "setting", "seed", "attacks"],
            [
                [r.name, r.setting, str(r.seed), ", ".join(c.key for c in r.candidates) or "(none: utility)"]
                for r in runs
            ],
        ),
    ]
    blocks += [Code(json.dumps(cfg.to_dict(), indent=2, default=str), folded="the audited config")]
    md, html = write(out, f"vflnet audit: {Path(source).name}", blocks, stem="audit")
    result = {
        "config": source,
        "protocol": cfg.protocol.kind,
        "budget": budget,
        "seeds": seeds,
        "notes": notes,
        "settings": [{"name": s.name, "defenses": s.defenses, "not_applicable": s.reason} for s in settings],
        "utility": utility,
        "applicable": rows_json,
        "skipped": [
            {
                "attack": c.attack,
                "party": c.party,
                "position": c.position,
                "man_in_the_middle": c.mitm,
                "reason": c.reason,
            }
            for c in skipped
        ],
        "defense_capability_score": dcs_json,
        "vary": vary_json,
        "runs": [
            {
                "name": r.name,
                "setting": r.setting,
                "seed": r.seed,
                "group": r.group,
                "null": r.group.startswith(NULL),
                "attacks": [c.key for c in r.candidates],
            }
            for r in runs
        ],
        "report": {"markdown": str(md), "html": str(html)},
    }
    (out / "audit.json").write_text(json.dumps(result, indent=2, default=str))
    return result
