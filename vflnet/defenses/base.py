"""The defense plug-in API. A defense belongs to the party that defends; it is either a model
component of that party or a transform of that party's outgoing messages, applied by the party
before the message is encoded (and, under split-he, before it is encrypted)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from vflnet.config import Config
from vflnet.registry import Param, validate_params


class Defense(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    roles: ClassVar[frozenset[str]]
    params: ClassVar[dict[str, Param]] = {}
    acts_on: ClassVar[str] = (
        "labels"  # "labels": active-party label defense; "upload": param-server gradient upload
    )
    implementation: ClassVar[type]  # the class `build` makes (for label defenses: a LabelDefense subclass)
    protocols: ClassVar[frozenset[str] | None] = None  # the protocols it acts under (None: every one)

    def __init__(self, **params: Any) -> None:
        self.p = validate_params("defense", self.name, self.params, params)

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """(config key, problem) pairs that make this defense at ``party`` act on nothing in the run
        (``vflnet config check`` reports the first): a protocol it does not act under."""
        if cls.protocols is not None and cfg.protocol.kind not in cls.protocols:
            return [
                (
                    "protocol.kind",
                    f"acts only under {sorted(cls.protocols)}, where the active party computes on "
                    f"plaintext embeddings; this run is {cfg.protocol.kind!r}",
                )
            ]
        return []

    @abstractmethod
    def build(self, num_classes: int, seed: int) -> Any:
        """The object the host party uses (for active-party label defenses: a LabelDefense)."""


def build_upload_defenses(
    cfg: Config, party: str
) -> list[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]:
    """The transforms a party applies to its gradient upload (param-server), in config order."""
    from vflnet.data.partition import party_seed
    from vflnet.registry import DEFENSES

    out = []
    for entry in cfg.defenses:
        if entry.party != party:
            continue
        defense = DEFENSES.get(entry.name)(**entry.params)
        if getattr(defense, "acts_on", "") == "upload":
            out.append(defense.build(0, party_seed(cfg, cfg.party(party))))
    return out
