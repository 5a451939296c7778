"""Vertical partitioning: what one party loads. Each party keeps only its own columns and IDs;
only the active party keeps labels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflnet.config import Config, FeaturesConfig, ModelConfig, PartyConfig
from vflnet.data.datasets import Dataset, load_dataset
from vflnet.registry import MODELS


def takes_image(bottom: ModelConfig) -> bool:
    """Whether a bottom model of this kind takes [n, 1, h, w] image regions (the kind's registry entry)."""
    return bool(MODELS.get(bottom.kind).image_input)


@dataclass
class PartyData:
    ids: np.ndarray  # int64 [n], sorted
    x: np.ndarray | None  # float32 [n, d] or [n, 1, h, w]; None for a featureless active party
    y: np.ndarray | None  # int64 [n]; active party only
    n_classes: int

    def rows(self, sample_ids: np.ndarray) -> np.ndarray:
        """Row indices of the given IDs; raises KeyError naming an unknown ID."""
        pos = self.ids.searchsorted(sample_ids)
        # np.minimum, not np.clip: positions are never negative, and clip's Python wrapper cost more
        # than the search on every step
        np.minimum(pos, len(self.ids) - 1, out=pos)
        bad = self.ids[pos] != sample_ids
        if bad.any():
            raise KeyError(f"sample id {int(np.asarray(sample_ids)[bad][0])} is not held by this party")
        return pos


def parse_columns(spec: str | list[int], n_features: int) -> np.ndarray:
    if isinstance(spec, list):
        cols = np.asarray(spec, dtype=np.int64)
    else:
        parts = []
        for piece in spec.split(","):
            piece = piece.strip()
            if ":" in piece:
                a, b = piece.split(":")
                parts.extend(range(int(a or 0), int(b or n_features)))
            else:
                parts.append(int(piece))
        cols = np.asarray(parts, dtype=np.int64)
    if len(cols) == 0:
        raise ValueError("no columns selected")
    if cols.min() < 0 or cols.max() >= n_features:
        raise ValueError(f"columns must lie in [0, {n_features}), got {int(cols.min())}..{int(cols.max())}")
    if len(np.unique(cols)) != len(cols):
        raise ValueError("a column is listed twice")
    return cols


def select_features(data: Dataset, features: FeaturesConfig, as_image: bool) -> np.ndarray:
    """The party's slice of the feature matrix: flat [n, d], or [n, 1, h, w] when ``as_image``."""
    if features.region is not None:
        if not data.is_image:
            raise ValueError(f"dataset {data.name!r} is not an image dataset; use 'columns'")
        r0, r1, c0, c1 = features.region
        height, width = data.features.shape[1:]
        if not (0 <= r0 < r1 <= height and 0 <= c0 < c1 <= width):
            raise ValueError(f"region {features.region} is outside the {height}x{width} image")
        region = data.features[:, r0:r1, c0:c1]
        return region[:, None] if as_image else region.reshape(len(region), -1)
    flat = data.features.reshape(len(data.features), -1)
    return flat[:, parse_columns(features.columns, flat.shape[1])]  # type: ignore[arg-type]


def flat_columns(data: Dataset, features: FeaturesConfig) -> np.ndarray:
    """The flat feature indices a party holds (an image region's pixels as row * width + column)."""
    flat = np.arange(int(np.prod(data.features.shape[1:])))
    if features.region is not None:
        r0, r1, c0, c1 = features.region
        return flat.reshape(data.features.shape[1:])[r0:r1, c0:c1].ravel()
    return parse_columns(features.columns, len(flat))  # type: ignore[arg-type]


def party_seed(cfg: Config, party: PartyConfig) -> int:
    return cfg.run.seed * 1000 + [p.name for p in cfg.parties].index(party.name)


def held_rows(cfg: Config, party: PartyConfig, data: Dataset) -> np.ndarray:
    """The dataset rows a party holds (its seeded ``sample_fraction`` of them), in the order of their IDs."""
    keep = np.arange(len(data.ids))
    if party.sample_fraction < 1.0:
        rng = np.random.default_rng([party_seed(cfg, party), 3])
        keep = np.sort(
            rng.choice(len(keep), size=int(round(len(keep) * party.sample_fraction)), replace=False)
        )
    return keep[np.argsort(data.ids[keep], kind="stable")]


def party_view(
    cfg: Config, party_name: str, dataset: Dataset | None = None, as_trained: bool = True
) -> PartyData:
    """The rows a party holds. ``as_trained``: with the config's empirical null applied, as the party
    loads them (``data.permute_labels``, ``data.resample_features``: the same in every process); False:
    the data set's own (ground truth, for scoring)."""
    party = cfg.party(party_name)
    data = dataset if dataset is not None else load_dataset(cfg.data.dataset, cfg.data.params)
    order = held_rows(cfg, party, data)
    x = None
    if party.features is not None:
        assert party.bottom is not None
        x = select_features(data, party.features, as_image=takes_image(party.bottom))
        if as_trained and party.role == "passive" and cfg.data.resample_features is not None:
            x = _marginal_draws(x, cfg.data.resample_features)
        x = x[order]
    y = None
    if party.role == "active":
        labels = data.labels
        if as_trained and cfg.data.permute_labels is not None:
            labels = labels[np.random.default_rng(cfg.data.permute_labels).permutation(len(labels))]
        y = labels[order]
    return PartyData(ids=data.ids[order], x=x, y=y, n_classes=data.n_classes)


def _marginal_draws(x: np.ndarray, seed: int) -> np.ndarray:
    """Each feature column (pixel) permuted among the samples on its own: every value is a draw from that
    column's marginal, and what the columns say about each other and about the label is gone."""
    rng = np.random.default_rng(seed)
    flat = x.reshape(len(x), -1).copy()
    for j in range(flat.shape[1]):
        flat[:, j] = flat[rng.permutation(len(flat)), j]
    return flat.reshape(x.shape)


def normalize(x: np.ndarray, train_rows: np.ndarray, mode: str, is_image: bool) -> np.ndarray:
    """Normalise a party's own features using statistics of its own training rows only."""
    if mode == "auto":
        if is_image and x.size and (x.min() < 0 or x.max() > 1):
            raise ValueError(
                f"image values span [{x.min():g}, {x.max():g}]; `data.normalize: auto` leaves images as "
                "they are and expects [0, 1]: set data.normalize to minmax or standard"
            )
        mode = "none" if is_image else "standard"
    if mode == "none":
        return x.astype(np.float32)
    train = x[train_rows]
    if mode == "standard":
        mean, std = train.mean(axis=0), train.std(axis=0)
        return ((x - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)
    lo, hi = train.min(axis=0), train.max(axis=0)
    return ((x - lo) / np.where(hi > lo, hi - lo, 1.0)).astype(np.float32)
