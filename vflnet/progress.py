"""Progress bars of the long commands (`vflnet run`, `sweep`, `reproduce`, `bench`): tqdm on stderr.

Every bar is made by `bar`, under one rule: it shows on a terminal only (tqdm's ``disable=None``), so
logs and pipes stay clean; ``VFLNET_QUIET=1`` turns every bar off, on a terminal too (CI, the test
suite). A command opens one bar with `runs` and the code below it reports each finished unit of work
with `advance`, without knowing whether a bar is open.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

_bars: list[Any] = []  # the open bars of this process, innermost last


def quiet() -> bool:
    """True when VFLNET_QUIET is set to anything but empty or 0."""
    return os.environ.get("VFLNET_QUIET", "") not in ("", "0")


def bar(desc: str, total: int | None = None, unit: str = "run", *, shown: bool = True, **options: Any) -> Any:
    """A bar on stderr, drawn on a terminal only, never under VFLNET_QUIET, nor when the command was
    asked for none (``shown``: a --quiet or --no-progress flag). ``options``: more of tqdm's."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        dynamic_ncols=True,
        disable=True if quiet() or not shown else None,
        **options,
    )


@contextmanager
def runs(
    desc: str, total: int | None = None, unit: str = "run", *, initial: int = 0, shown: bool = True
) -> Iterator[Any]:
    """A bar that `advance` moves while the block runs (from ``initial``: units done before); a bar
    opened inside it shows below it."""
    opened = bar(desc, total, unit, shown=shown, initial=initial, position=len(_bars), leave=not _bars)
    _bars.append(opened)
    try:
        yield opened
    finally:
        _bars.pop()
        opened.close()


def advance(label: str) -> None:
    """One unit of work of the innermost bar done (`label`: what it was); nothing when none is open."""
    if _bars:
        _bars[-1].set_postfix_str(label, refresh=False)
        _bars[-1].update(1)


def note(line: str) -> None:
    """``line`` on stderr, above any open bar (a plain print would cut through it); shown in logs and
    pipes too, where bars are off."""
    tqdm.write(line, file=sys.stderr)
