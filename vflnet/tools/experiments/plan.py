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

Nothing a sweep sets may be replaced in every run, and no config runs twice: keys are compared as
parsed paths, in the order they are set (command line, ``set``, ``grid``, ``zip``, ``seeds``), and a
key set again at or above an earlier one, or under one whose value holds it, is refused
(``vflnet.overrides.replaces``); so are a list that repeats a value and two runs whose checked run
configs are the same.
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

from vflnet.config import Config, ConfigError, RunConfig, read_yaml
from vflnet.overrides import (
    COMMAND_LINE,
    apply_overrides,
    blame,
    key_string,
    parse_overrides,
    parse_path,
    replaces,
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


def _canonical(value: Any) -> str:
    """One spelling of a value or config, for telling equal ones apart from different ones."""
    return json.dumps(value, sort_keys=True, default=str)


def _refuse_repeats(values: list[Any], source: str, key: str, what: str) -> None:
    """A list of the runs' values that holds one twice would run one config twice: refused."""
    seen: set[str] = set()
    for value in values:
        if _canonical(value) in seen:
            raise ConfigError(source, key, f"lists {what} {value!r} twice: the runs of a sweep differ")
        seen.add(_canonical(value))


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
    seeds = data.get("seeds")  # None: each run keeps the run.seed its config has
    if seeds is not None and (
        not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds)
    ):
        raise ConfigError(source, "seeds", f"expected a non-empty list of integers, got {seeds!r}")
    writes = [_Write(f"{COMMAND_LINE} ({o.text})", o.key, [o.value], COMMAND_LINE) for o in parsed]
    writes += [_Write("set", key, [value], source) for key, value in fixed.items()]
    writes += [
        _Write(section, key, values, source)
        for section, keys in (("grid", grid), ("zip", zipped))
        for key, values in keys.items()
    ]
    writes += [_Write("seeds", "run.seed", seeds, source)] if seeds is not None else []
    _refuse_replaced(writes)
    base = apply_overrides(_base(data, path), parsed)
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        sizes = ", ".join(f"{k}: {len(v)}" for k, v in zipped.items())
        raise ConfigError(source, "zip", f"every list must have the same length, got {sizes}")

    for key, values in grid.items():
        _refuse_repeats(values, source, f"grid.{key}", "the value")
    zip_rows = [dict(zip(zipped, row, strict=True)) for row in zip(*zipped.values(), strict=True)] or [{}]
    _refuse_repeats(zip_rows, source, "zip", "the row")
    _refuse_repeats(seeds or [], source, "seeds", "the seed")
    grid_rows = [dict(zip(grid, row, strict=True)) for row in itertools.product(*grid.values())]
    runs: list[PlannedRun] = []
    resolved: dict[str, PlannedRun] = {}  # each run's checked config (but its id) -> the run
    with blame(parsed):
        for grid_row, zip_row, seed in itertools.product(grid_rows, zip_rows, seeds or [None]):
            config = copy.deepcopy(base)
            params = {**grid_row, **zip_row}
            for section, values in (("set", fixed), ("grid", grid_row), ("zip", zip_row)):
                for key, value in values.items():
                    set_path(config, key, value, source, f"{section}.{key}")
            run_seed = config.get("run", {}).get("seed", RunConfig().seed) if seed is None else seed
            set_path(config, "run.seed", run_seed, source, "seeds")
            run_id = run_name(len(runs), config)
            config["run"]["id"] = run_id
            # the run config's own checks; its errors name this file and the run's values
            cfg = config_from_dict(config, f"{source} (run {run_id}: {_describe(params, run_seed)})")
            run = PlannedRun(run_id, run_seed, params, config)
            same = resolved.setdefault(_fingerprint(cfg), run)
            if same is not run:
                differ = [k for k in params if _canonical(params[k]) != _canonical(same.params.get(k))]
                raise ConfigError(
                    source,
                    ", ".join(differ),
                    f"runs {same.name} ({_describe(same.params, same.seed)}) and {run_id} "
                    f"({_describe(params, run_seed)}) resolve to the same run config: a sweep runs each config "
                    "once; drop one of the values",
                )
            runs.append(run)
    return Sweep(name, path, [*grid, *zipped], runs, list(overrides))


@dataclass(frozen=True)
class _Write:
    """One key a sweep sets, with the value(s) it sets it to."""

    section: str  # "command line (KEY=VALUE)", "set", "grid", "zip" or "seeds"
    key: str  # as written
    values: list[Any]  # its value, or every value it takes in turn
    source: str  # what an error about it names: the command line or the sweep file


def _refuse_replaced(writes: list[_Write]) -> None:
    """Refuse a key that a later one (in the order the sweep sets them: command line, set, grid, zip,
    seeds) replaces in every run: the same key in either spelling, a key above it, or a key under it
    that its value holds (a zip over ``train.optimizer`` with ``{kind, lr}`` values after a grid over
    ``train.optimizer.lr``). A key under a ``set`` value that the value lacks adds to it: ``set``
    may build a list entry whose fields ``grid`` and ``zip`` vary."""
    paths = [_path(w) for w in writes]
    for i, earlier in enumerate(writes):
        for later, path in zip(writes[i + 1 :], paths[i + 1 :], strict=True):
            if not replaces(path, paths[i], earlier.values):
                continue
            key = key_string(paths[i])
            if earlier.source != later.source:  # an override the sweep file replaces
                raise ConfigError(
                    earlier.section,
                    key,
                    f"the sweep file's {later.section!r} sets {later.key!r} in every run: change it there",
                )
            if len(path) <= len(paths[i]):  # the same key, or one above it: all of it goes
                raise ConfigError(
                    earlier.source,
                    key,
                    f"{later.section} {later.key!r} replaces {earlier.section} {earlier.key!r} in every run: "
                    "a key may appear in only one of set, grid and zip (keys are compared as paths: "
                    "parties[2].x is parties.2.x, and a key above another replaces all of it)",
                )
            raise ConfigError(
                earlier.source,
                key,
                f"{later.section} {later.key!r} replaces the {key_string(path)} that {earlier.section} "
                f"{earlier.key!r} sets, in every run: leave it out of that value",
            )


def _path(write: _Write) -> list[str | int]:
    where = write.key if write.source == COMMAND_LINE else f"{write.section}.{write.key}"
    return parse_path(write.key, write.source, where)


def _fingerprint(cfg: Config) -> str:
    """A checked run config as one string, without what names it (its id) and what it reads nothing of:
    its resolved form (`Config.to_dict`: no source, no record of which keys were written)."""
    data = cfg.to_dict()
    data["run"].pop("id", None)
    return _canonical(data)


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
