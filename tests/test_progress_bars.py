"""One rule for every progress bar (vflnet.progress.bar: on a terminal only, never under VFLNET_QUIET):
no other module makes a tqdm bar of its own."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_every_progress_bar_is_made_by_vflnet_progress() -> None:
    own = [
        str(path.relative_to(REPO))
        for path in (REPO / "vflnet").rglob("*.py")
        if path.name != "progress.py"
        and re.search(r"\btqdm\(|from tqdm import|import tqdm", path.read_text())
    ]
    assert own == []
