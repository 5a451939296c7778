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
from vflnet.registry import ATTACKS
from vflnet.tools.audit.execute import NEVER_ACTED, PlannedRun, Setting
from vflnet.tools.audit.selection import Candidate
from vflnet.tools.experiments import capability
from vflnet.tools.experiments.document import Block, Code, Heading, Table, Text, write

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
            "the baseline, and the mean by more than a practical margin."
        ),
        Table(
            [
                "attack",
                "position",
                "threat model",
                "metric",
                "value [95% interval]",
                "baseline",
                "verdict",
                "paper",
                "reproduce",
            ],
            verdict_rows,
        ),
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
        ]
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
        "report": {"markdown": str(md), "html": str(html)},
    }
    (out / "audit.json").write_text(json.dumps(result, indent=2, default=str))
    return result
