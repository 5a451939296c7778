"""A sweep file, expanded into the runs it declares.

A sweep file is YAML with these keys (docs/experiments.md):

- ``base`` (required): a run config, as a path relative to the sweep file or inline as a mapping;
- ``name``: the sweep's name (default: the file's stem);
- ``seeds``: list of ``run.seed`` values, every combination runs once per seed (default: the base's seed);
- ``set``: ``{key: value}`` applied to every run;
- ``grid``: ``{key: [values...]}``, the cartesian product of all lists;
- ``zip``: ``{key: [values...]}``, lists of one length walked together (one run per position), crossed
  with the grid.

A key is a dotted path into the run config (`vflnet.overrides`); ``[i]`` or ``.i`` indexes a list:
``train.batch_size``, ``parties[2].bottom.hidden``, ``defenses.0.params.scale``. A missing mapping key
is created (the run config's own check then rejects it if the schema has no such key); a list index
must exist. Every expanded run is checked as a run config, and every error names the sweep file and
the key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflnet.config import ConfigError, read_yaml
from vflnet.overrides import (
    COMMAND_LINE,
    Override,
    apply_overrides,
    at_or_under,
    blame,
    key_string,
    parse_overrides,
    parse_path,
    set_path,
)
from vflnet.validation import config_from_dict

SWEEP_KEYS = ("base", "name", "seeds", "set", "grid", "zip")


@dataclass(frozen=True)
class PlannedRun:
    name: str  # unique in the sweep, a DNS label (it names Kubernetes objects too)
    seed: int
    params: dict[str, Any]  # the grid and zip values of this run, in the sweep file's key order
    config: dict[str, Any]  # the whole run config


@dataclass(frozen=True)
class Sweep:
    name: str
    source: Path
    keys: list[str]  # the varied keys (grid, then zip): the table's parameter columns
    runs: list[PlannedRun]
    overrides: list[str]  # the command line's KEY=VALUE, set into the base config


def _mapping(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(source, key, f"expected a mapping of key paths, got {value!r}")
    return value


def _lists(data: dict[str, Any], key: str, source: str) -> dict[str, list[Any]]:
    section = _mapping(data, key, source)
    for path, values in section.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(source, f"{key}.{path}", f"expected a non-empty list of values, got {values!r}")
    return section


def _base(data: dict[str, Any], path: Path) -> dict[str, Any]:
    source = str(path)
    base = data.get("base")
    if isinstance(base, str):
        base_path = path.parent / base
        if not base_path.exists():
            raise ConfigError(source, "base", f"no such run config: {base_path}")
        base = read_yaml(base_path)
    if not isinstance(base, dict):
        raise ConfigError(
            source, "base", "expected a run config: a path (relative to this file) or a mapping"
        )
    return base


def run_name(index: int, config: dict[str, Any]) -> str:
    """``r<index>-<hash of the config>``: a changed sweep file never reuses another config's results."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return f"r{index:03d}-{digest[:8]}"


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> Sweep:
    """The runs of a sweep file; ``overrides`` (the command line's ``KEY=VALUE``) change its base run
    config, and one of a key the sweep file sets, varies or seeds is refused (it would be replaced)."""
    path = Path(path)
    source = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(source, "", "expected a mapping with 'base' and 'grid'/'zip'/'seeds'")
    for key in data:
        if key not in SWEEP_KEYS:
            raise ConfigError(source, str(key), f"unknown key; allowed here: {', '.join(SWEEP_KEYS)}")
    name = str(data.get("name") or path.stem)
    fixed = _mapping(data, "set", source)
    grid = _lists(data, "grid", source)
    zipped = _lists(data, "zip", source)
    parsed = parse_overrides(overrides)
    swept = {"set": fixed, "grid": grid, "zip": zipped, "seeds": {"run.seed": None}}
    _refuse_swept(parsed, {section: keys for section, keys in swept.items() if section in data}, source)
    base = apply_overrides(_base(data, path), parsed)
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        sizes = ", ".join(f"{k}: {len(v)}" for k, v in zipped.items())
        raise ConfigError(source, "zip", f"every list must have the same length, got {sizes}")
    seeds = data.get("seeds", [base.get("run", {}).get("seed", 0)])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(source, "seeds", f"expected a non-empty list of integers, got {seeds!r}")
    overlap = (set(grid) & set(zipped)) | ((set(grid) | set(zipped)) & set(fixed))
    if overlap:
        raise ConfigError(source, sorted(overlap)[0], "a key may appear in only one of set, grid, zip")

    zip_rows = [dict(zip(zipped, row, strict=True)) for row in zip(*zipped.values(), strict=True)] or [{}]
    grid_rows = [dict(zip(grid, row, strict=True)) for row in itertools.product(*grid.values())]
    runs: list[PlannedRun] = []
    with blame(parsed):
        for grid_row, zip_row, seed in itertools.product(grid_rows, zip_rows, seeds):
            config = copy.deepcopy(base)
            params = {**grid_row, **zip_row}
            for section, values in (("set", fixed), ("grid", grid_row), ("zip", zip_row)):
                for key, value in values.items():
                    set_path(config, key, value, source, f"{section}.{key}")
            set_path(config, "run.seed", seed, source, "seeds")
            run_id = run_name(len(runs), config)
            config["run"]["id"] = run_id
            # the run config's own checks; its errors name this file and the run's values
            config_from_dict(config, f"{source} (run {run_id}: {_describe(params, seed)})")
            runs.append(PlannedRun(run_id, seed, params, config))
    return Sweep(name, path, [*grid, *zipped], runs, list(overrides))


def _refuse_swept(overrides: Sequence[Override], sections: dict[str, dict[str, Any]], source: str) -> None:
    """An override of a key the sweep file's ``set``, ``grid``, ``zip`` or ``seeds`` also sets (in every
    run, after the base) would be replaced: refused."""
    for section, keys in sections.items():
        for key in keys:
            swept = key_string(parse_path(key, source, f"{section}.{key}"))
            for override in overrides:
                if at_or_under(override.key, swept):
                    raise ConfigError(
                        f"{COMMAND_LINE} ({override.text})",
                        override.key,
                        f"the sweep file's {section!r} sets {key!r} in every run: change it there",
                    )


def _describe(params: dict[str, Any], seed: int) -> str:
    return ", ".join([*(f"{k}={v}" for k, v in params.items()), f"seed={seed}"])


def run_meta(sweep: Sweep, run: PlannedRun) -> dict[str, Any]:
    """A run's sweep-run.json: what its row of the results table names it by."""
    return {"sweep": sweep.name, "run": run.name, "seed": run.seed, "params": run.params}


def plan_json(sweep: Sweep) -> dict[str, Any]:
    return {
        "name": sweep.name,
        "source": str(sweep.source),
        "keys": sweep.keys,
        "overrides": sweep.overrides,
        "runs": [run_meta(sweep, r) for r in sweep.runs],
    }
