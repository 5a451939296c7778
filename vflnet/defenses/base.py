"""The defense plug-in API. A defense belongs to the party that defends; it is either a model
component of that party or a transform of that party's outgoing messages, applied by the party
before the message is encoded (and, under split-he, before it is encrypted).

A defense names the hook point it acts at (``acts_on``) and any further hook point it needs
(``requires``); a protocol names the hook points its sides apply (``Protocol.defense_hooks``), and
config validation refuses a defense the run's protocol would not apply. Every defense is applied
through ``attach``: the one place that picks a party's defenses for a hook point.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from vflnet.config import Config
from vflnet.registry import Param, validate_params

# Every defense hook point, the one list: a defense's ``acts_on`` and ``requires`` and a protocol's
# ``defense_hooks`` name only these (checked when each registers, vflnet/registration.py).
HOOK_POINTS: dict[str, str] = {
    "labels": "the active party's label defense on its loss, gradients and predictions",
    "bottom": "a passive party's bottom model, replaced or wrapped",
    "scores": "the released confidence vectors (PREDICT phase)",
    "upload": "the gradient upload to the coordinator (param-server)",
    "plaintext-embeddings": "the active party computes on the passive parties' embeddings in the clear",
}


class Defense(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    roles: ClassVar[frozenset[str]]
    params: ClassVar[dict[str, Param]] = {}
    # the hook point it acts at: "labels" (the active party's loss, gradients and predictions), "bottom"
    # (a passive party's bottom model), "scores" (released confidence vectors), "upload" (param-server's
    # gradient upload); see HOOK_POINTS and Protocol.defense_hooks
    acts_on: ClassVar[str] = "labels"
    # further hook points the run's protocol must offer ("plaintext-embeddings": the active party
    # computes on the passive parties' embeddings in the clear, as MID's bottleneck and dCor need)
    requires: ClassVar[frozenset[str]] = frozenset()
    implementation: ClassVar[type]  # the class `build` makes (for label defenses: a LabelDefense subclass)

    def __init__(self, **params: Any) -> None:
        self.p = validate_params("defense", self.name, self.params, params)

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """(config key, problem) pairs that make this defense at ``party`` act on nothing in the run
        beyond its hook points (``vflnet config check`` reports the first)."""
        return []

    @abstractmethod
    def build(self, num_classes: int, seed: int) -> Any:
        """The object the host party uses (for active-party label defenses: a LabelDefense)."""


def attach(cfg: Config, party: str, hook: str, num_classes: int = 0) -> list[Any]:
    """The defenses of ``party`` that act at ``hook``, built (``Defense.build``) under the party's seed,
    in config order. One at a hook point the run's protocol does not declare would have no effect and
    is refused (config validation refuses such a run before it starts).

    The one way a defense enters a party, so the host counts here (vflnet/threat/effects.py): that the
    protocol reached ``hook``, and each use of what every defense built (``count_uses``). A configured
    defense that acted zero times fails the run."""
    from vflnet.data.partition import party_seed
    from vflnet.registry import DEFENSES, PROTOCOLS
    from vflnet.threat import effects

    mine = [e for e in cfg.defenses if e.party == party]
    at = [i for i, e in enumerate(mine) if DEFENSES.get(e.name).acts_on == hook]
    entries = [mine[i] for i in at]
    offered = PROTOCOLS.get(cfg.protocol.kind).defense_hooks
    if entries and hook not in offered:
        raise ValueError(
            f"protocol {cfg.protocol.kind!r} applies defenses at {sorted(offered)}, not at {hook!r}: "
            f"{[e.name for e in entries]} would have no effect"
        )
    seed = party_seed(cfg, cfg.party(party))
    counts = effects.of(cfg, party)
    keys = counts.built(hook, at)
    return [
        effects.count_uses(
            DEFENSES.get(e.name)(**e.params).build(num_classes, seed),
            functools.partial(counts.acted, key),
        )
        for e, key in zip(entries, keys, strict=True)
    ]
