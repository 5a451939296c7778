"""The defense plug-in API. A defense belongs to the party that defends; it is either a model
component of that party or a transform of that party's outgoing messages, applied by the party
before the message is encoded (and, under split-he, before it is encrypted)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from vflnet.plugins import Param, validate_params


class Defense(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    roles: ClassVar[frozenset[str]]
    params: ClassVar[dict[str, Param]] = {}

    def __init__(self, **params: Any) -> None:
        self.p = validate_params("defense", self.name, self.params, params)

    @abstractmethod
    def build(self, num_classes: int, seed: int) -> Any:
        """The object the host party uses (for active-party label defenses: a LabelDefense)."""
