"""Key paths into a run config, and the ``KEY=VALUE`` overrides of the command line.

A key path is dotted; a list is indexed from 0 by ``[i]`` or by a number between dots:
``train.batch_size``, ``parties[2].bottom.hidden`` and ``parties.2.bottom.hidden`` are keys. Sweep files
(`vflnet.tools.experiments.plan`) and the command line (`vflnet run FILE KEY=VALUE ...`) use the same paths.

An override's value is YAML (``3``, ``0.01``, ``true``, ``null``, ``[32, 16]``, ``{kind: sgd}``), set
into the file's mapping before the config is parsed, so it is typed and checked exactly like the file.
A mapping key that is missing is created (the schema then refuses one it does not know); a list
index must exist. An error about an overridden key (or a key under it) names the command line
instead of the file.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from vflnet.config import ConfigError

COMMAND_LINE = "command line"
_PATH = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*|\.\d+|\[\d+\])*")
_TOKEN = re.compile(r"[A-Za-z_][\w-]*|\d+")


def parse_path(path: str, source: str, where: str) -> list[str | int]:
    """``"parties[2].bottom.out"`` or ``"parties.2.bottom.out"`` -> ``["parties", 2, "bottom", "out"]``."""
    if not _PATH.fullmatch(path):
        raise ConfigError(
            source, where, f"{path!r} is not a key path like 'train.batch_size' or 'parties[2].bottom.out'"
        )
    return [int(token) if token.isdigit() else token for token in _TOKEN.findall(path)]


def key_string(tokens: Sequence[str | int]) -> str:
    """A key path as config errors write it: ``parties[2].bottom.out``."""
    return "".join(f"[{t}]" if isinstance(t, int) else f".{t}" for t in tokens).lstrip(".")


def set_path(config: dict[str, Any], path: str, value: Any, source: str, where: str) -> None:
    """Set ``value`` at ``path`` in ``config`` (in place), creating missing mapping keys."""
    tokens = parse_path(path, source, where)
    node: Any = config
    for depth, token in enumerate(tokens):
        if isinstance(token, int):
            if not isinstance(node, list) or token >= len(node):
                what = f"a list of {len(node)}" if isinstance(node, list) else "not a list"
                raise ConfigError(source, where, f"index [{token}] does not exist: the value there is {what}")
        elif not isinstance(node, dict):
            raise ConfigError(source, where, f"{token!r} sits under a value that is not a mapping")
        if depth == len(tokens) - 1:
            node[token] = copy.deepcopy(value)
        elif isinstance(token, str):
            node = node.setdefault(token, {})
        else:
            node = node[token]


@dataclass(frozen=True)
class Override:
    text: str  # as given: "parties.2.bottom.hidden=[32]"
    key: str  # as config errors write it: "parties[2].bottom.hidden"
    value: Any


def replaces(later: Sequence[str | int], earlier: Sequence[str | int], values: Sequence[Any]) -> bool:
    """Whether setting the key path ``later`` replaces some of what setting ``earlier`` to one of
    ``values`` set before it (both as ``parse_path`` tokens, so either list index spelling is one key):
    ``later`` is ``earlier`` or above it (the whole value goes), or lies under it where such a value
    holds something (that part goes; a key under it that the value lacks only adds to it)."""
    later, earlier = tuple(later), tuple(earlier)
    if earlier[: len(later)] == later:
        return True
    if later[: len(earlier)] != earlier:
        return False
    return any(_holds(value, later[len(earlier) :]) for value in values)


def _holds(value: Any, tokens: Sequence[str | int]) -> bool:
    """Whether ``value`` has something at the key path ``tokens`` (mapping keys, list indices)."""
    for token in tokens:
        if isinstance(value, dict) and isinstance(token, str) and token in value:
            value = value[token]
        elif isinstance(value, list) and isinstance(token, int) and token < len(value):
            value = value[token]
        else:
            return False
    return True


def at_or_under(key: str, parent: str) -> bool:
    """Whether config key ``key`` is ``parent`` or lies under it."""
    return key == parent or key.startswith((f"{parent}.", f"{parent}["))


def parse_overrides(items: Sequence[str]) -> list[Override]:
    """``KEY=VALUE`` strings (the value is YAML); a malformed one is refused naming the command line, and
    so is one that a later one replaces (``replaces``: ``parties[2].x`` and ``parties.2.x`` are one key)."""
    overrides: list[Override] = []
    for text in items:
        path, sep, raw = text.partition("=")
        if not sep:
            raise ConfigError(COMMAND_LINE, "", f"{text!r} is not KEY=VALUE (e.g. train.epochs=3)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(COMMAND_LINE, path, f"the value {raw!r} is not valid YAML: {exc}") from exc
        tokens = parse_path(path, COMMAND_LINE, path)
        for earlier in overrides:
            if replaces(tokens, parse_path(earlier.key, COMMAND_LINE, earlier.key), [earlier.value]):
                raise ConfigError(
                    f"{COMMAND_LINE} ({earlier.text})", earlier.key, f"{text} replaces it: set each key once"
                )
        overrides.append(Override(text, key_string(tokens), value))
    return overrides


def apply_overrides(data: Any, overrides: Sequence[Override]) -> Any:
    """A copy of the config mapping ``data`` with every override set (a non-mapping is left to the parser)."""
    if not overrides or not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    with blame(overrides):
        for override in overrides:
            set_path(data, override.key, override.value, "", override.key)
    return data


@contextlib.contextmanager
def blame(overrides: Sequence[Override]) -> Iterator[None]:
    """Re-raise a config error about an overridden key (or one under it) as the command line's; an error
    about a key above an override names both the file and the override."""
    try:
        yield
    except ConfigError as exc:
        for override in overrides:
            if at_or_under(exc.key, override.key):
                raise ConfigError(f"{COMMAND_LINE} ({override.text})", exc.key, exc.message) from exc
        for override in overrides:
            if exc.key and at_or_under(override.key, exc.key):
                source = f"{exc.source} with {COMMAND_LINE} {override.text}".lstrip()
                raise ConfigError(source, exc.key, exc.message) from exc
        raise
