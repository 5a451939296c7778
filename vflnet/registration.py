"""What each registry checks when an entry registers (vflnet/registry.py ``Registry.register``).

One check per kind, run on every entry, built-in or plug-in, as it registers: a declaration that
cannot work is refused then, as a ``RegistrationError`` naming the entry's class and each problem,
instead of passing ``config check`` and failing (or doing nothing) when a run starts. Each check
returns the problems it finds (none: the entry registers); it reads only the entry's declarations,
what the registered gRPC services declare (``vflnet.interceptors.events.METHODS``: register a plug-in's
service with ``register_messages`` before its classes), the defense hook points
(``vflnet.defenses.base.HOOK_POINTS``), the knowledge kinds (``vflnet.threat.knowledge.KNOWLEDGE``)
and the config schema. What depends on a run (does the run's protocol have a tapped method, apply a
defense's hook point) stays with config validation (vflnet/validation.py).

The checks import the kinds' modules when first called: those modules import the registry.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection
from typing import Any

from vflnet.registry import Param

ROLES = ("coordinator", "active", "passive")


def attack_problems(entry: Any) -> list[str]:
    """An attack class: complete (roles, taps, no abstract method), its taps and rewrites name a
    direction, a side of a party's channel and a registered method, its knowledge kinds exist, and every
    hook it declares is one it implements (and the other way round: a hook it implements but never
    declares would never be called)."""
    from vflnet.interceptors.events import DIRECTIONS, PARTY_SIDES, method_short_names
    from vflnet.threat.attack import Attack, Tap
    from vflnet.threat.knowledge import KNOWLEDGE

    if not (isinstance(entry, type) and issubclass(entry, Attack)):
        return ["an attack is a subclass of vflnet.threat.attack.Attack"]
    problems = _class_problems(entry, "attack")
    taps: list[Any] = []
    for field in ("taps", "rewrites"):
        value = getattr(entry, field, None)
        if not isinstance(value, tuple) or not all(isinstance(t, Tap) for t in value):
            problems.append(f"{field} must be a tuple of Tap, got {value!r}")
        else:
            taps += [(field, t) for t in value]
    methods = method_short_names()
    for field, tap in taps:
        for what, value, valid in (
            ("direction", tap.direction, DIRECTIONS),
            ("side", tap.side, PARTY_SIDES),
            ("method", tap.method, sorted(methods)),
        ):
            if value not in valid:
                problems.append(
                    f"{field} {tap}: {what} {value!r} is none of {list(valid)}"
                    + (
                        " (a plug-in registers its service with register_messages first)"
                        if what == "method"
                        else ""
                    )
                )
    knowledge = getattr(entry, "knowledge", ())
    if not isinstance(knowledge, tuple) or not all(isinstance(k, str) for k in knowledge):
        problems.append(f"knowledge must be a tuple of names, got {knowledge!r}")
        knowledge = ()
    for name in knowledge:
        if name not in KNOWLEDGE:
            problems.append(f"knowledge {name!r} is no known kind (known: {', '.join(sorted(KNOWLEDGE))})")
    for flag in ("wants_own_view", "changes_own_data"):
        if not isinstance(getattr(entry, flag), bool):
            problems.append(f"{flag} must be True or False, got {getattr(entry, flag)!r}")
    if not (taps or entry.wants_own_view or entry.changes_own_data or knowledge):
        problems.append(
            "it declares nothing to see: no taps, rewrites, knowledge, wants_own_view or changes_own_data"
        )
    # a declared hook that is not implemented does nothing; an implemented one never declared never runs
    for declared, hook, what in (
        (bool(getattr(entry, "rewrites", ())), "rewrite", "rewrites"),
        (entry.wants_own_view, "observe_own", "wants_own_view = True"),
        (entry.changes_own_data, "own_data", "changes_own_data = True"),
        ("predictions" in knowledge, "observe_predictions", "the 'predictions' knowledge"),
    ):
        implemented = getattr(entry, hook) is not getattr(Attack, hook)
        if declared and not implemented:
            problems.append(f"it declares {what} but does not implement {hook}(): it would change nothing")
        elif implemented and not declared:
            problems.append(f"it implements {hook}() but does not declare {what}: it would never be called")
    return problems


def defense_problems(entry: Any) -> list[str]:
    """A defense class: complete (roles, implementation, no abstract method), its hook points exist."""
    from vflnet.defenses.base import HOOK_POINTS, Defense

    if not (isinstance(entry, type) and issubclass(entry, Defense)):
        return ["a defense is a subclass of vflnet.defenses.base.Defense"]
    problems = _class_problems(entry, "defense")
    acts_on = entry.acts_on if isinstance(entry.acts_on, str) else repr(entry.acts_on)
    problems += _known("acts_on", [acts_on], HOOK_POINTS, "hook point")
    problems += _known("requires", _names(entry.requires, "requires", problems), HOOK_POINTS, "hook point")
    if not callable(getattr(entry, "implementation", None)):
        problems.append("it declares no implementation (the class or function build makes)")
    return problems


def protocol_problems(entry: Any) -> list[str]:
    """A protocol class: its sides (with their handlers, checked against the registered services), the
    hook points, shared settings and knowledge it declares, and its params."""
    from vflnet.config import ProtocolConfig
    from vflnet.defenses.base import HOOK_POINTS
    from vflnet.interceptors.events import METHODS
    from vflnet.sdk.contract import HOST_METHODS, CoordinatorSide, PartySide, Protocol
    from vflnet.sdk.handlers import handler_problems, handlers_of
    from vflnet.threat.knowledge import KNOWLEDGE

    if not (isinstance(entry, type) and issubclass(entry, Protocol)):
        return ["a protocol is a subclass of vflnet.sdk.Protocol"]
    problems = _description_problems(entry) + _params_problems(entry)
    problems += _known("roles", _names(entry.roles, "roles", problems), ROLES, "role")
    for role, base in (("coordinator", CoordinatorSide), ("active", PartySide), ("passive", PartySide)):
        side = getattr(entry, role, None)
        if not (isinstance(side, type) and issubclass(side, base)):
            problems.append(f"{role} must be a subclass of {base.__name__}, got {side!r}")
            continue
        if base is PartySide and side.step is PartySide.step:
            problems.append(f"{role} side {side.__qualname__} does not implement step()")
        problems += handler_problems(side)
        for attr, spec in handlers_of(side).items():
            if spec.method in HOST_METHODS:
                problems.append(f"{side.__qualname__}.{attr} handles {spec.method}, which the host serves")
    problems += _known(
        "defense_hooks", _names(entry.defense_hooks, "defense_hooks", problems), HOOK_POINTS, "hook point"
    )
    shared = [f.name for f in dataclasses.fields(ProtocolConfig) if f.name not in ("kind", "params")]
    problems += _known("settings", _names(entry.settings, "settings", problems), shared, "protocol setting")
    delivered = [k.name for k in KNOWLEDGE.values() if k.by_protocol]
    problems += _known(
        "provides", _names(entry.provides, "provides", problems), delivered, "protocol-delivered knowledge"
    )
    declared = entry.methods - set(entry.callers)  # those beside the handlers (checked above)
    problems += [
        f"methods: {m} is in no registered gRPC service" for m in sorted(declared) if m not in METHODS
    ]
    return problems


def dataset_problems(entry: Any) -> list[str]:
    """A dataset: a DatasetSource with a loader, a description and valid params."""
    from vflnet.data.datasets import DatasetSource

    if not isinstance(entry, DatasetSource):
        return ["a dataset is a vflnet.data.datasets.DatasetSource (register it with @register_dataset)"]
    problems = _description_problems(entry) + _params_problems(entry)
    if not callable(entry.load):
        problems.append(f"its loader is not callable: {entry.load!r}")
    return problems


def model_problems(entry: Any) -> list[str]:
    """A model kind: a ModelKind that can sit somewhere (a bottom or a top builder), with a description."""
    from vflnet.models.zoo import ModelKind

    if not isinstance(entry, ModelKind):
        return ["a model kind is a vflnet.models.zoo.ModelKind"]
    problems = _description_problems(entry)
    builders = {"build_bottom": entry.build_bottom, "build_top": entry.build_top}
    for key, fn in builders.items():
        if fn is not None and not callable(fn):
            problems.append(f"{key} is not callable: {fn!r}")
    if entry.build_bottom is None and entry.build_top is None:
        problems.append("it has neither build_bottom nor build_top, so it can sit nowhere")
    if entry.image_input and entry.build_bottom is None:
        problems.append("image_input applies to a bottom, but it has no build_bottom")
    return problems


# ------------------------------------------------------------------------------------------ helpers
def _class_problems(entry: type, kind: str) -> list[str]:
    """An attack's or defense's class: no abstract method left, a description, roles, valid params."""
    problems = _description_problems(entry) + _params_problems(entry)
    if inspect.isabstract(entry):
        missing = ", ".join(sorted(getattr(entry, "__abstractmethods__", ())))
        problems.append(f"it leaves abstract methods unimplemented: {missing}")
    if not hasattr(entry, "roles"):
        problems.append(f"it declares no roles (where it may sit, among {list(ROLES)})")
    else:
        roles = _names(entry.roles, "roles", problems)
        if not roles:
            problems.append(f"roles is empty: the {kind} could sit nowhere")
        problems += _known("roles", roles, ROLES, "role")
    return problems


def _description_problems(entry: Any) -> list[str]:
    description = getattr(entry, "description", None)
    if isinstance(description, str) and description.strip():
        return []
    return [f"it needs a one-line description (a non-empty string), got {description!r}"]


def _params_problems(entry: Any) -> list[str]:
    """``params`` maps names to ``Param`` (a default may be a placeholder a required value replaces)."""
    params = getattr(entry, "params", {})
    if isinstance(params, dict) and all(
        isinstance(k, str) and isinstance(p, Param) for k, p in params.items()
    ):
        return []
    return [f"params must map names to vflnet.registry.Param, got {params!r}"]


def _names(value: Any, field: str, problems: list[str]) -> list[str]:
    """A declared set of names as a list; a problem (and no names) if it is not a set of strings."""
    if (
        isinstance(value, Collection)
        and not isinstance(value, str)
        and all(isinstance(v, str) for v in value)
    ):
        return sorted(value)
    problems.append(f"{field} must be a set of names, got {value!r}")
    return []


def _known(field: str, names: list[str], known: Collection[str], what: str) -> list[str]:
    return [
        f"{field} names {name!r}, which is no {what} (known: {', '.join(sorted(known))})"
        for name in names
        if name not in known
    ]
