"""A test attack that needs another party's model: it may only get it through a model release."""

from __future__ import annotations

import numpy as np

from vflnet.registry import ATTACKS
from vflnet.threat.attack import Attack, Tap


@ATTACKS.register
class ModelThief(Attack):
    name = "model-thief"
    description = "test only: keeps the model another party released to its host"
    roles = frozenset({"passive", "coordinator"})
    taps = (Tap("ReceiveModel", "request", "server"),)
    knowledge = ("released_model",)

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.senders: list[str] = []

    def observe(self, event) -> None:  # type: ignore[no-untyped-def]
        self.senders.append(event.sender)

    def output(self) -> dict[str, np.ndarray]:
        released = self.context.knowledge.get("released_model", {})
        out = {
            f"{owner}__{name}": value
            for owner, got in released.items()
            for name, value in got["parameters"].items()
        }
        out["tapped_from"] = np.array(self.senders)
        return out
