"""What every process of a run must agree on: its resolved config, less the keys that are each
process's own. A party sends it in its JoinRequest (``config``, canonical JSON); the coordinator admits
it only if it equals its own, and otherwise names the first key that differs (docs/reliability.md,
"One config for every process"). A party started with another seed or other columns than the rest
would otherwise train a different model, and the run's numbers would change with nothing saying why.

Per-process keys (``PER_PROCESS``): where the process keeps its runs (``run.dir``) and whether its
launcher resumes (``run.auto_resume``), its threads and log level (``runtime``), its own TLS files
(``transport.tls.ca``, ``cert``, ``key``: paths on its machine), and how the parties are reached
(``parties[].address``, ``parties[].via``: each machine may see them at other addresses).
"""

from __future__ import annotations

import json
from typing import Any

from vflnet.config import Config

PER_PROCESS = (
    "run.dir",
    "run.auto_resume",
    "runtime",
    "transport.tls.ca",
    "transport.tls.cert",
    "transport.tls.key",
    "parties[].address",
    "parties[].via",
)


def _drop(data: Any, path: list[str]) -> None:
    head, rest = path[0], path[1:]
    if head.endswith("[]"):
        for item in data[head[:-2]]:
            _drop(item, rest)
    elif rest:
        _drop(data[head], rest)
    else:
        data.pop(head, None)  # absent where the config does not read it (`Config.to_dict`)


def shared_json(cfg: Config) -> str:
    """The resolved config less ``PER_PROCESS``, as canonical JSON (sorted keys, no spaces)."""
    data = cfg.to_dict()
    for key in PER_PROCESS:
        _drop(data, key.split("."))
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def first_difference(mine: Any, theirs: Any, key: str = "") -> tuple[str, Any, Any] | None:
    """The first key (config notation: ``parties[2].features.columns``) where ``theirs`` differs from
    ``mine``, with both values (None where a side lacks the key); None if they are equal."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for k in sorted(mine.keys() | theirs.keys()):
            found = first_difference(mine.get(k), theirs.get(k), f"{key}.{k}" if key else k)
            if found is not None:
                return found
        return None
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            found = first_difference(a, b, f"{key}[{i}]")
            if found is not None:
                return found
        return None
    return None if mine == theirs else (key, mine, theirs)


def config_mismatch(cfg: Config, party: str, sent: str) -> str | None:
    """Why the config ``party`` joined with is not the coordinator's (None if it is)."""
    try:
        theirs = json.loads(sent)
    except json.JSONDecodeError:
        return f"party {party!r} sent no readable config (JoinRequest.config); start it with vflnet party"
    found = first_difference(json.loads(shared_json(cfg)), theirs)
    if found is None:
        return None
    key, mine, their_value = found
    return (
        f"party {party!r} was started with another config: {key} is {their_value!r} there and {mine!r} "
        "at the coordinator; every process of a run needs the same config file (per-process keys "
        f"excepted: {', '.join(PER_PROCESS)})"
    )
