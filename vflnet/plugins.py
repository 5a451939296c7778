"""Registries of attacks and defenses, by name, with whitelisted and validated parameters.

The CLI (`vflnet attacks`, `vflnet defenses`), config checking and the parties all resolve names
here; nothing dispatches through module globals. A config may list extra modules under `plugins:`
that register their own attacks or defenses when imported.
"""

from __future__ import annotations

import importlib
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
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ValueError(f"{kind} {name!r} has no parameter(s) {unknown}; parameters: {sorted(spec) or 'none'}")
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


T = TypeVar("T")


class Registry:
    def __init__(self, kind: str, builtin_modules: Iterable[str]) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._builtin = list(builtin_modules)
        self._loaded = False

    def register(self, cls: T) -> T:
        name = cls.name  # type: ignore[attr-defined]
        if name in self._entries and self._entries[name] is not cls:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = cls
        return cls

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self._builtin:
                importlib.import_module(module)

    def get(self, name: str) -> Any:
        self._load()
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def all(self) -> dict[str, Any]:
        self._load()
        return dict(sorted(self._entries.items()))


def load_plugin_modules(modules: Iterable[str]) -> None:
    for module in modules:
        importlib.import_module(module)


ATTACKS = Registry("attack", [
    "vflnet.attacks.embedding_recorder",
    "vflnet.attacks.direct_label",
    "vflnet.attacks.gradient_scaling",
    "vflnet.attacks.batch_label",
    "vflnet.attacks.backdoor",
    "vflnet.attacks.split_label_scoring",
    "vflnet.attacks.cafe_tap",
])
DEFENSES = Registry("defense", ["vflnet.defenses.registered"])


def describe(registry: Registry) -> str:
    lines = []
    for name, cls in registry.all().items():
        where = ", ".join(sorted(cls.roles))
        lines.append(f"{name}  [{where}]  {cls.description}")
        for key, p in cls.params.items():
            lines.append(f"    {key} (default {p.default!r}): {p.help}")
    return "\n".join(lines)
