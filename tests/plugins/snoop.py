"""A planted attack for the isolation test: it tries to reach ground truth and other parties' state
from inside its host passive party and reports what it found."""

from __future__ import annotations

import gc

import numpy as np

from vflnet.registry import ATTACKS
from vflnet.threat.attack import Attack, Tap


@ATTACKS.register
class Snoop(Attack):
    name = "snoop"
    description = "test only: looks for labels and other parties' state in its host process"
    roles = frozenset({"passive"})
    taps = (Tap("ExchangeEmbeddings", "response", "client"),)

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.found: dict[str, bool] = {}
        self.senders: set[str] = set()

    def observe(self, event) -> None:  # type: ignore[no-untyped-def]
        self.senders.add(event.sender)
        if self.found:
            return
        self.found["context_has_labels"] = any(
            hasattr(self.context, a) for a in ("labels", "y", "truth", "config", "cfg")
        )
        objects = gc.get_objects()
        kinds = {type(o).__name__ for o in objects}
        self.found["active_party_object"] = "ActiveParty" in kinds
        self.found["dataset_object"] = "Dataset" in kinds
        self.found["label_like_array"] = any(
            isinstance(o, np.ndarray)
            and o.ndim == 1
            and o.size > 100
            and o.dtype.kind == "i"
            and o.min() >= 0
            and o.max() < 10
            for o in objects
        )

    def output(self) -> dict[str, np.ndarray]:
        return {**{k: np.array(v) for k, v in self.found.items()}, "senders": np.array(sorted(self.senders))}
