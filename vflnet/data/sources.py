"""A party's own table (``parties[].source``): the one file its process opens, checked on load with
one-line errors that name the party, the file and the column; and ``vflnet data split``, which
writes such files from a built-in dataset.

IDs are compared as text (the cell's characters, stripped): ``007`` and ``7`` are different IDs.
Only the active party's file holds a label column.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.config import Config, PartyConfig
from vflnet.data.datasets import load_dataset
from vflnet.data.partition import PartyData, held_rows, select_features, takes_image
from vflnet.extras import require


class SourceError(ValueError):
    """Bad input in a party's own file: one line naming the party, the file and the column."""


def _table(path: Path, where: str) -> dict[str, list[str]]:
    """The file's columns as text, by name."""
    if not path.is_file():
        raise SourceError(f"{where}: no such file")
    if path.suffix == ".parquet":
        pq = require("pyarrow.parquet", f"{where}: a Parquet source")
        table = pq.read_table(path)
        return {name: [str(v) for v in table.column(name).to_pylist()] for name in table.column_names}
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise SourceError(f"{where}: the file is empty (expected a header row naming the columns)")
        rows = list(reader)
    header = [h.strip() for h in header]
    bad = next((i for i, r in enumerate(rows) if len(r) != len(header)), None)
    if bad is not None:
        raise SourceError(f"{where}: line {bad + 2} has {len(rows[bad])} cells, the header {len(header)}")
    return {name: [r[i].strip() for r in rows] for i, name in enumerate(header)}


def _numbers(values: list[str], where: str) -> np.ndarray:
    try:
        out = np.array(values, dtype=np.float64)
    except ValueError:
        bad = next(v for v in values if not _is_number(v))
        raise SourceError(f"{where}: non-numeric value {bad!r}") from None
    if np.isnan(out).any():
        raise SourceError(f"{where}: NaN in row {int(np.flatnonzero(np.isnan(out))[0]) + 1}")
    if np.isinf(out).any():
        raise SourceError(f"{where}: an infinite value in row {int(np.flatnonzero(np.isinf(out))[0]) + 1}")
    return out


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def load_source(cfg: Config, party: PartyConfig) -> PartyData:
    """The party's rows from its own file, sorted by ID (text); labels as class indices (active only)."""
    src = party.source
    assert src is not None
    if party.bottom is not None and src.features and takes_image(party.bottom):
        raise SourceError(f"party {party.name!r}: a file holds flat columns; its bottom model takes images")
    path = Path(src.path)
    where = f"party {party.name!r}, file {src.path}"
    table = _table(path, where)
    if not next(iter(table.values()), []):
        raise SourceError(f"{where}: no rows")
    wanted = [src.id_column, *src.features] + ([src.label_column] if party.role == "active" else [])
    for col in wanted:
        if col not in table:
            raise SourceError(f"{where}, column {col!r}: no such column; columns are {', '.join(table)}")
    label = cfg.active.source.label_column if cfg.active.source is not None else ""
    if party.role != "active" and label in table:
        raise SourceError(
            f"{where}, column {label!r}: a passive party's file holds no label column (remove it)"
        )
    keys = np.array(table[src.id_column], dtype=object)
    if any(k == "" for k in keys):
        raise SourceError(f"{where}, column {src.id_column!r}: an empty ID in row {list(keys).index('') + 1}")
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    dup = np.flatnonzero(keys[1:] == keys[:-1])
    if len(dup):
        raise SourceError(f"{where}, column {src.id_column!r}: duplicate ID {keys[dup[0]]!r}")
    x = None
    if src.features:
        cols = [_numbers(table[c], f"{where}, column {c!r}") for c in src.features]
        x = np.stack(cols, axis=1)[order].astype(np.float32)
    y, n_classes = None, 0
    if party.role == "active":
        classes, y_index = np.unique(np.array(table[src.label_column])[order], return_inverse=True)
        y, n_classes = y_index.astype(np.int64), len(classes)
    return PartyData(ids=np.arange(len(keys), dtype=np.int64), x=x, y=y, n_classes=n_classes, keys=keys)


# ------------------------------------------------------------------------------ vflnet data split
def split_dataset(cfg: Config, out: Path, overlap: float, seed: int) -> dict[str, dict[str, Any]]:
    """One CSV per party from the config's dataset, ``OUT/NAME/NAME.csv``: the party's columns (``f0``, ``f1``...), IDs as
    strings, rows shuffled per party, and only a share ``overlap`` of the samples held by every party
    (each other sample is held by a seeded subset of the parties, never all). The active party's file
    alone holds ``label``. Returns each party's ``source`` section."""
    if not 0 < overlap <= 1:
        raise ValueError(f"--overlap must lie in (0, 1], got {overlap}")
    data = load_dataset(cfg.data.dataset, cfg.data.params)
    holders = [p for p in cfg.parties if p.role != "coordinator"]
    n = len(data.ids)
    rng = np.random.default_rng([seed, 57])
    common = rng.random(n) < overlap
    # each other sample: every party but one (drawn) holds it, so none is common by accident
    missing_at = rng.integers(0, len(holders), n)
    out.mkdir(parents=True, exist_ok=True)
    sections: dict[str, dict[str, Any]] = {}
    for i, party in enumerate(holders):
        rows = held_rows(cfg, party, data)
        rows = rows[common[rows] | (missing_at[rows] != i)]
        rows = rows[rng.permutation(len(rows))]
        header = ["id"]
        x = np.zeros((len(rows), 0))
        if party.features is not None:
            assert party.bottom is not None
            x = select_features(data, party.features, as_image=False)[rows].reshape(len(rows), -1)
            header += [f"{party.name}_f{j}" for j in range(x.shape[1])]
        if party.role == "active":
            header.append("label")
        path = out / party.name / f"{party.name}.csv"  # a folder per party: what it alone mounts
        path.parent.mkdir(exist_ok=True)
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            for r, row in zip(rows, x, strict=True):
                cells = [f"s{int(data.ids[r]):07d}", *(repr(float(v)) for v in row)]
                w.writerow(cells + ([str(int(data.labels[r]))] if party.role == "active" else []))
        section: dict[str, Any] = {
            "path": str(path),
            "id_column": "id",
            "features": header[1 : 1 + x.shape[1]],
        }
        if party.role == "active":
            section["label_column"] = "label"
        sections[party.name] = section
    return sections
