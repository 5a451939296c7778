"""What every configured attack, defense and protocol hook point did in a run, counted by the host.

Nothing here is written by an attack or a defense: a party's interception counts its attacks (the
messages each tapped and rewrote, the own-step and prediction views delivered to it, the rows of its
party's own data it changed, the samples in its output), and ``vflnet.defenses.base.attach``, the one
place a defense enters a party, counts what passes through each object it builds (``count_uses``) and
how often the protocol reached each hook point. Each party sends its counts to the coordinator in its
reply to Shutdown; the coordinator writes them all into summary.json (``effects``) and fails a run in
which a configured entry acted zero times (``never_acted``), naming it and why.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vflnet.config import Config
    from vflnet.threat.attack import Attack

# what the host counts per attack; ``Attack.required_effects`` says which must not stay zero
ATTACK_COUNTS = ("tapped", "rewritten", "own_views", "prediction_views", "own_rows")


def entry_key(name: str, party: str) -> str:
    return f"{name}@{party}"


class Effects:
    """One party's counts (a process may hold several: the loopback bridge runs every role in one)."""

    def __init__(self, cfg: Config, party: str) -> None:
        self.party = party
        self.protocol = cfg.protocol.kind
        self.lock = threading.Lock()  # counted from the party's gRPC threads
        self.attacks: dict[str, dict[str, int]] = {}
        self.required: dict[str, dict[str, str]] = {}  # attack key -> count -> what zero of it means
        self.samples: dict[str, int | None] = {}  # attack key -> samples in its output (None: not per sample)
        self.defenses: dict[str, dict[str, Any]] = {}  # key -> {"hook", "built", "acted"}
        self.hooks: dict[str, int] = {}  # hook point -> times the protocol reached it (called ``attach``)
        from vflnet.registry import DEFENSES

        seen: dict[str, int] = {}
        self.defense_keys: list[str] = []  # this party's defense entries, in config order
        for entry in cfg.defenses:
            if entry.party != party:
                continue
            key = entry_key(entry.name, party)
            seen[key] = seen.get(key, 0) + 1
            key = key if seen[key] == 1 else f"{key}#{seen[key]}"
            self.defense_keys.append(key)
            self.defenses[key] = {"hook": DEFENSES.get(entry.name).acts_on, "built": 0, "acted": 0}

    # ------------------------------------------------------------------------------ attacks
    def add_attack(self, key: str, attack: Attack) -> None:
        self.attacks[key] = dict.fromkeys(ATTACK_COUNTS, 0)
        self.required[key] = attack.required_effects()

    def count(self, key: str, what: str, n: int = 1) -> None:
        with self.lock:
            self.attacks[key][what] += n

    def output_samples(self, key: str, output: dict[str, np.ndarray]) -> None:
        ids = output.get("sample_ids")
        self.samples[key] = None if ids is None else int(len(ids))

    # ----------------------------------------------------------------------------- defenses
    def built(self, hook: str, entries: list[int]) -> list[str]:
        """The protocol built this party's defenses at ``hook``: the ``entries``-th of its defense
        entries (indices into ``defense_keys``); returns their keys."""
        with self.lock:
            self.hooks[hook] = self.hooks.get(hook, 0) + 1
            keys = [self.defense_keys[i] for i in entries]
            for key in keys:
                self.defenses[key]["built"] += 1
            return keys

    def acted(self, key: str) -> None:
        with self.lock:
            self.defenses[key]["acted"] += 1

    # ------------------------------------------------------------------------------ results
    def report(self) -> dict[str, Any]:
        """The counts, and every entry of this party that acted zero times with the reason."""
        with self.lock:
            attacks = {k: {**v, "samples": self.samples.get(k)} for k, v in self.attacks.items()}
            defenses = {k: dict(v) for k, v in self.defenses.items()}
            applied = {  # the protocol reached it ``reached`` times, built ``defenses`` there
                f"{hook}@{self.party}": {
                    "reached": n,
                    "defenses": sum(1 for d in defenses.values() if d["hook"] == hook),
                    "applied": sum(d["acted"] for d in defenses.values() if d["hook"] == hook),
                }
                for hook, n in self.hooks.items()
            }
        return {
            "attacks": attacks,
            "defenses": defenses,
            "hooks": applied,
            "never_acted": self._never_acted(attacks, defenses),
        }

    def _never_acted(self, attacks: dict[str, Any], defenses: dict[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, counts in attacks.items():
            zero = [why for what, why in self.required[key].items() if not counts[what]]
            if counts["samples"] == 0 and any(counts[k] for k in ATTACK_COUNTS):
                zero.append("its output holds 0 samples")
            if zero:
                out[key] = f"{key} {'; '.join(zero)}"
        for key, d in defenses.items():
            if d["acted"]:
                continue
            if not d["built"]:
                why = f"protocol {self.protocol!r} declares hook {d['hook']!r} but never applied it"
            else:
                why = (
                    f"protocol {self.protocol!r} built it at hook {d['hook']!r} but never passed "
                    "a message or batch through it"
                )
            out[key] = f"defense {key} acted 0 times: {why}"
        return out

    def state(self) -> dict[str, Any]:
        """For a coordinated checkpoint: a resumed run counts on from it."""
        with self.lock:
            return {
                "attacks": {k: dict(v) for k, v in self.attacks.items()},
                "defenses": {k: dict(v) for k, v in self.defenses.items()},
                "hooks": dict(self.hooks),
            }

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Add the counts of the sessions before a resumed run's checkpoint."""
        if not state:
            return
        with self.lock:
            for key, counts in state["attacks"].items():
                for what, n in counts.items():
                    if key in self.attacks and what in self.attacks[key]:
                        self.attacks[key][what] += n
            for key, d in state["defenses"].items():
                if key in self.defenses:
                    self.defenses[key]["built"] += d["built"]
                    self.defenses[key]["acted"] += d["acted"]
            for hook, n in state["hooks"].items():
                self.hooks[hook] = self.hooks.get(hook, 0) + n


# ------------------------------------------------------------------- each party's, by name
_PARTIES: dict[tuple[str, str], Effects] = {}
_PARTIES_LOCK = threading.Lock()


def register(cfg: Config, party: str) -> Effects:
    """The counts of ``party`` in this run: made when its interception is (before its protocol side
    and its model, so before any ``attach``); a later run of the same id replaces them."""
    effects = Effects(cfg, party)
    with _PARTIES_LOCK:
        _PARTIES[(cfg.run.id, party)] = effects
    return effects


def of(cfg: Config, party: str) -> Effects:
    """The counts ``attach`` adds to: the party's, or throwaway ones where no party of the run is
    hosted in this process (a tool that builds a party's modules, e.g. the reference run)."""
    with _PARTIES_LOCK:
        found = _PARTIES.get((cfg.run.id, party))
    return found if found is not None else Effects(cfg, party)


# ------------------------------------------------------------ counting what a defense does
def count_uses(built: Any, on_use: Callable[[], None]) -> Any:
    """``built`` (what ``Defense.build`` made), counting each use: a callable (a transform of scores or
    of an upload, a bottom wrapper) becomes a counting function; an object (a ``LabelDefense``) gets
    its public methods counted: those its class overrides (a method of the interface left as it is
    does nothing), or all of them if it has no base that defines any. A call that returns a module (a
    wrapped bottom model, a trained bottleneck) counts that module's forward passes instead."""
    if callable(built):
        return _counting(built, on_use)
    public = [n for n in dir(type(built)) if not n.startswith("_") and callable(getattr(type(built), n))]
    overridden = [n for n in public if sum(n in vars(c) for c in type(built).__mro__) > 1]
    for name in overridden or public:
        setattr(built, name, _counting(getattr(built, name), on_use))
    return built


def _counting(fn: Callable[..., Any], on_use: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if _is_module(out):
            out.register_forward_hook(ForwardCount(on_use))
        else:
            on_use()
        return out

    return counted


def _is_module(obj: Any) -> bool:
    try:
        from torch import nn
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return isinstance(obj, nn.Module)


class ForwardCount:
    """A forward hook counting a module's forward passes; a snapshot copy of the module
    (``copy.deepcopy``, pickling) keeps the hook but not the count: it counts nowhere."""

    def __init__(self, on_use: Callable[[], None] | None) -> None:
        self.on_use = on_use

    def __call__(self, module: Any, inputs: Any, output: Any) -> None:
        if self.on_use is not None:
            self.on_use()

    def __deepcopy__(self, memo: dict[int, Any]) -> ForwardCount:
        return ForwardCount(None)

    def __reduce__(self) -> tuple[Any, ...]:
        return ForwardCount, (None,)


def merge_effects(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every role's ``Effects.report`` (by role name) as summary.json's ``effects``."""
    merged: dict[str, Any] = {"attacks": {}, "defenses": {}, "hooks": {}, "never_acted": {}}
    for report in reports.values():
        for part in merged:
            merged[part].update(report.get(part, {}))
    return merged
