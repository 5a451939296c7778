"""Registries of the pluggable parts, by name: attacks, defenses, datasets, model kinds, protocols.

One pattern for all of them. A registry discovers its built-ins by importing every module of its
package (``vflnet.attacks``, ``vflnet.defenses``, ``vflnet.data``, ``vflnet.models``,
``vflnet.protocols``) once, on the first lookup; modules whose names start with ``_`` are skipped.
Each entry has a ``name`` (and a one-line ``description`` where the CLI lists it); a name is
registered once, and an unknown name is an error that lists the known ones.

A config may list extra modules under ``plugins:``; every process imports them before it resolves a
name, and they register into any registry by decorating::

    from vflnet.registry import ATTACKS

    @ATTACKS.register
    class MyAttack(Attack):
        name = "my-attack"
        ...

Parameters of attacks, defenses and datasets are declared as :class:`Param` and checked by
:func:`validate_params`, which names the parameter and what was expected.

Every entry, built-in or plug-in, is checked as it registers by its kind's check
(vflnet/registration.py): an entry that declares what cannot work (a tap on a method no service has,
a hook point that does not exist, a handler whose types are not its method's) is refused then, with
a :class:`RegistrationError` naming the class and every problem, not when a run starts.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class Param:
    """One settable parameter: its default, a check, and a one-line description."""

    default: Any
    help: str
    check: Callable[[Any], bool] = lambda v: True
    expect: str = "a valid value"


def validate_params(kind: str, name: str, spec: dict[str, Param], given: dict[str, Any]) -> dict[str, Any]:
    """The parameters with defaults filled in; ValueError naming the first unknown or bad one."""
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ValueError(
            f"{kind} {name!r} takes no parameter(s) {unknown}; parameters: {sorted(spec) or 'none'}"
        )
    values = {k: p.default for k, p in spec.items()}
    values.update(given)
    for key, value in values.items():
        ok = False
        try:
            ok = bool(spec[key].check(value))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{kind} {name!r} parameter {key!r}: expected {spec[key].expect}, got {value!r}")
    return values


class RegistrationError(TypeError):
    """An entry whose declarations cannot work: refused when it registers, naming it and each problem."""


class UnknownName(KeyError):
    """A name no entry of the registry has; the message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0])


T = TypeVar("T")


class Registry:
    """Entries of one kind by name, with built-ins discovered from ``package`` on first lookup."""

    def __init__(self, kind: str, package: str, check: str = "") -> None:
        self.kind = kind
        self.package = package
        # "module:function", (entry) -> problems: the kind's registration check, imported when first
        # needed (it reads the kind's API, which imports this module)
        self.check = check
        self._entries: dict[str, Any] = {}
        self._loaded = False

    def register(self, entry: T) -> T:
        """Add ``entry`` (a class or an object with a ``name``); usable as a class decorator."""
        name = getattr(entry, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} entry needs a non-empty string 'name', got {name!r}")
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        problems = registration_problems(self.check, entry)
        if problems:
            raise RegistrationError(
                f"{self.kind} {name!r} ({entry_origin(entry)}) cannot register: " + "; ".join(problems)
            )
        self._entries[name] = entry
        return entry

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # before importing: a scanned module may look a name up while it loads
        try:
            package = importlib.import_module(self.package)
            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
                if not info.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{info.name}")
        except BaseException:
            self._loaded = False
            raise

    def get(self, name: str) -> Any:
        self._load()
        if name not in self._entries:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def all(self) -> dict[str, Any]:
        self._load()
        return dict(sorted(self._entries.items()))


def registration_problems(check: str, entry: Any) -> list[str]:
    """What the check ``"module:function"`` finds wrong with ``entry`` (none without a check), each
    problem once (a class serving as two sides is checked twice)."""
    if not check:
        return []
    module, _, function = check.partition(":")
    return list(dict.fromkeys(getattr(importlib.import_module(module), function)(entry)))


def entry_origin(entry: Any) -> str:
    """Where an entry was defined, for a refusal: ``module.Class``, or for an object (a dataset, a model
    kind) its type and the first function it holds (its loader or builder)."""
    if isinstance(entry, type):
        return f"{entry.__module__}.{entry.__qualname__}"
    functions = [v for v in getattr(entry, "__dict__", {}).values() if inspect.isfunction(v)]
    where = f" from {functions[0].__module__}.{functions[0].__qualname__}" if functions else ""
    return type(entry).__name__ + where


def load_plugin_modules(modules: Iterable[str]) -> None:
    """Import a config's ``plugins:`` modules (each registers what it brings when imported). A module
    whose entry is refused at registration cannot be imported: an ImportError with the refusal."""
    for module in modules:
        try:
            importlib.import_module(module)
        except RegistrationError as exc:
            raise ImportError(f"{module}: {exc}") from exc


ATTACKS = Registry("attack", "vflnet.attacks", "vflnet.registration:attack_problems")  # Attack classes
DEFENSES = Registry("defense", "vflnet.defenses", "vflnet.registration:defense_problems")  # Defense classes
DATASETS = Registry("dataset", "vflnet.data", "vflnet.registration:dataset_problems")  # DatasetSource
MODELS = Registry("model kind", "vflnet.models", "vflnet.registration:model_problems")  # ModelKind
PROTOCOLS = Registry("protocol", "vflnet.protocols", "vflnet.registration:protocol_problems")  # Protocol


def describe(registry: Registry) -> str:
    """What the CLI prints: one line per entry (name, where it sits, description), then its params."""
    entries = registry.all()
    width = max((len(name) for name in entries), default=0)
    lines = []
    for name, entry in entries.items():
        where = getattr(entry, "where", None) or ", ".join(sorted(getattr(entry, "roles", ())))
        lines.append(f"{name:<{width}}  " + (f"[{where}]  " if where else "") + entry.description)
        for key, p in getattr(entry, "params", {}).items():
            lines.append(f"    {key} (default {p.default!r}): {p.help}")
    return "\n".join(lines)
