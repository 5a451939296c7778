"""`vflnet audit CONFIG [KEY=VALUE ...]`: which registered attacks apply to this run, what each one gets
against its baseline, and (``--defenses``) what each defense buys and costs (docs/audit.md)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from vflnet.config import ConfigError, read_yaml
from vflnet.overrides import apply_overrides, blame, parse_overrides
from vflnet.tools.audit.budget import QUICK_TRAIN, SEEDS
from vflnet.tools.experiments.results import write_atomic

if TYPE_CHECKING:  # these import torch: imported where used, so `vflnet audit --help` does not
    from vflnet.config import Config
    from vflnet.tools.audit.selection import Candidate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vflnet audit",
        description="select every registered attack whose contract applies to a run config, run them "
        "(one run with every tap; one run per rewriting attack) over a few seeds, score each against its "
        "baseline and write audit.md, audit.html and audit.json",
    )
    p.add_argument("config", type=Path, help="the run config to audit (it must list no attacks)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, as for `vflnet run`")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: audits/<config stem>)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{SEEDS['quick']} seeds, training capped at {QUICK_TRAIN['epochs']} epoch and "
        f"{QUICK_TRAIN['max_steps']} steps (default: {SEEDS['default']} seeds, the config's training)",
    )
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (run.seed, run.seed + 1, ...)")
    p.add_argument(
        "--defenses",
        default="",
        help="comma list of defense names, or a YAML file of defense settings: each setting reruns the "
        "attacks and measures the main task (utility-leakage trade-off, defense capability score)",
    )
    p.add_argument(
        "--null",
        action="store_true",
        help="also run each group again per seed with its attacks' secret removed (data.permute_labels: the "
        "labels permuted among the samples; data.resample_features: each passive feature column drawn from "
        "its marginal): the empirical null the verdicts are tested against",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="audit the config again at each value of KEY (a config key, the values as YAML; repeat for "
        "more axes, each varied alone) and plot every attack's metric and the main task's accuracy along it",
    )
    p.add_argument("--select-only", action="store_true", help="print the selection and exit (no runs)")
    p.add_argument("--start", choices=("warm", "cold"), default="warm", help="how role processes start")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    try:
        return _main(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vflnet audit interrupted; the same command resumes it", file=sys.stderr)
        return 130


def prepare(
    config: Path, overrides: list[str], budget: str
) -> tuple[dict[str, Any], Config, list[Candidate]]:
    """The audited config (as a mapping with no attacks, and checked) and every attack position with
    its verdict of applicability."""
    from vflnet.tools.audit.selection import select
    from vflnet.validation import config_from_dict

    parsed = parse_overrides(overrides)
    data = apply_overrides(read_yaml(config), parsed)
    source = str(config)
    with blame(parsed):
        if isinstance(data, dict) and data.get("attacks"):
            raise ConfigError(
                source,
                "attacks",
                "the audit selects the attacks itself: audit a config without an attacks list "
                "(or add the override attacks=[])",
            )
        cfg = config_from_dict(data, source, check_data=True)
    base = cfg.to_dict()
    base["attacks"] = []
    return base, cfg, select(base, cfg, budget)


def parse_vary(items: list[str]) -> list[tuple[str, list[str]]]:
    """``--vary KEY=V1,V2,...``: (key, values as written), commas inside brackets or braces kept."""
    axes = []
    for text in items:
        key, sep, raw = text.partition("=")
        values, depth, current = [], 0, ""
        for ch in raw:
            depth += (ch in "[{") - (ch in "]}")
            if ch == "," and depth == 0:
                values.append(current.strip())
                current = ""
            else:
                current += ch
        values.append(current.strip())
        values = [v for v in values if v]
        if not sep or not key or len(values) < 2:
            raise ConfigError("--vary", key, f"{text!r} is not KEY=V1,V2,... with at least two values")
        if key in [k for k, _ in axes]:
            raise ConfigError("--vary", key, "each axis once")
        axes.append((key.strip(), values))
    return axes


def _main(args: argparse.Namespace) -> int:
    axes = parse_vary(args.vary)
    out = args.out or Path("audits") / args.config.stem
    if args.select_only:
        return run_audit(args, args.overrides, out, [])
    varied = []
    for key, values in axes:  # each axis alone, the others at the config's values
        points = []
        for value in values:
            name = f"{key.replace('[', '.').replace(']', '')}={value}"
            where = out / "vary" / re.sub(r"[^A-Za-z0-9_.=-]+", "-", name).strip("-")
            kept = [o for o in args.overrides if o.partition("=")[0].strip() != key]
            print(f"--vary {key}={value}: auditing into {where}", file=sys.stderr, flush=True)
            try:
                result = run_audit(args, kept + [f"{key}={value}"], where)
            except ConfigError as exc:  # this value's audit is refused by name; the others run
                result = {"refused": f"config error: {exc}"}
                print(f"--vary {key}={value}: refused: {exc}", file=sys.stderr, flush=True)
            points.append((value, result))
        varied.append((key, points))
    return run_audit(args, args.overrides, out, varied)


def run_audit(
    args: argparse.Namespace,
    overrides: list[str],
    out: Path,
    varied: list[tuple[str, list[tuple[str, dict[str, Any]]]]] | None = None,
) -> Any:
    """One audit of the config with these overrides into ``out``: its result (audit.json's content), or
    with ``--select-only`` the selection printed (0). ``varied``: the ``--vary`` audits its report plots."""
    from vflnet.tools.audit import document, execute

    budget = "quick" if args.quick else "default"
    source = str(args.config)
    base, cfg, cands = prepare(args.config, overrides, budget)
    if args.select_only:
        for c in cands:
            print(
                f"{'applies' if c.applies else 'skipped'}  {c.attack} @ {c.position}"
                + ("" if c.applies else f": {c.reason}")
            )
        return 0
    n = args.seeds if args.seeds is not None else SEEDS[budget]
    if n < 1:
        raise ConfigError("--seeds", "", f"expected at least 1 seed, got {n}")
    seeds = [cfg.run.seed + i for i in range(n)]
    from vflnet.data.datasets import load_dataset

    n_classes = load_dataset(cfg.data.dataset, cfg.data.params).n_classes
    settings = [execute.Setting("none")] + execute.defense_settings(args.defenses, cfg, base, n_classes)
    out.mkdir(parents=True, exist_ok=True)
    runs = execute.plan_runs(base, cands, settings, seeds, budget, null=args.null)
    notes = []
    if budget == "quick":
        notes.append(
            f"Quick budget: training capped at {QUICK_TRAIN['epochs']} epoch and "
            f"{QUICK_TRAIN['max_steps']} steps; the main task is not trained to convergence."
        )
    for s in settings:
        if s.reason:
            notes.append(f"Defense setting {s.name}: not applicable: {s.reason}")
    status = execute.execute(runs, out, start=args.start)
    per, utility = execute.collect(runs, status, cands, n_classes)
    rows = out / "rows"
    rows.mkdir(exist_ok=True)
    for cand in cands:
        if not cand.applies or cand.mitm or not cand.scored:
            continue
        for s in settings:
            row = per.get((cand.key, s.name))
            if row is None:
                continue
            name = f"{cand.key}.yaml" if s.name == "none" else f"{cand.key}+{execute.slug(s.name)}.yaml"
            config = execute.run_config(base, [cand], s, seeds[0], budget, [])
            config["run"]["id"] = ""
            write_atomic(rows / name, yaml.safe_dump(config, sort_keys=False))
            row["row_config"] = name
    result = document.build(
        out, source, cfg, budget, seeds, cands, settings, runs, per, utility, notes, varied or []
    )
    for r in result["applicable"]:
        v = r["by_setting"]["none"]
        value = (
            f"{v['metric']} {document.fmt(v['mean'])} (baseline {document.fmt(v.get('baseline'))})"
            if "metric" in v
            else ""
        )
        print(f"{r['attack']} @ {r['position']}: {v.get('verdict', 'not run')} {value}".rstrip())
    for r in result["skipped"]:
        print(f"{r['attack']} @ {r['position']}: not applicable: {r['reason']}")
    print(f"report: {result['report']['html']} (and audit.md, audit.json)")
    failed = [k for k, v in status.items() if v["status"] != "completed"]
    if failed:  # a failed run is a result of the audit (its rows say why); running again retries it
        print(
            f"{len(failed)} of {len(status)} runs failed (the rows say why): {', '.join(failed)}",
            file=sys.stderr,
        )
    return result if varied is None else 0
