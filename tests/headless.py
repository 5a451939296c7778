"""A report page in a real headless Chromium: what it rendered (element sizes read by a probe script
in a copy of the page, through --dump-dom) and a screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

# Without the background-networking flags Chromium's own connections are refused on a closed network
# and it stalls; scripts/setup.sh installs Debian's chromium as root.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",  # run the page's load handlers before the DOM is dumped
    "--window-size=1280,2000",
]

# Added to a copy of the page (the report itself has no script): each figure's and table's rendered
# size, and each image's decoded size, as attributes the dumped DOM carries.
_PROBE = """<script>
window.addEventListener("load", () => {
  for (const el of document.querySelectorAll("img, svg, table")) {
    const r = el.getBoundingClientRect();
    el.setAttribute("data-rendered", `${Math.round(r.width)}x${Math.round(r.height)}`);
    if (el.tagName === "IMG") el.setAttribute("data-natural", `${el.naturalWidth}x${el.naturalHeight}`);
  }
  document.body.setAttribute("data-probed", "yes");
});
</script>"""


@dataclass
class Rendered:
    dom: str
    screenshot: Path

    def sizes(self, tag: str, attribute: str = "data-rendered") -> list[tuple[int, int]]:
        found = re.findall(rf"<{tag}\b[^>]*\b{attribute}=\"(\d+)x(\d+)\"", self.dom)
        return [(int(w), int(h)) for w, h in found]


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(
            "chromium is not installed: `apt-get install -y chromium` (scripts/setup.sh does as root)"
        )
    return found


def render(page: Path, work: Path) -> Rendered:
    probed = work / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    screenshot = work / f"{page.stem}.png"
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [
                chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={screenshot}",
                "--dump-dom",
                probed.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'data-probed="yes"' in result.stdout, "the page's load handler did not run"
    return Rendered(result.stdout, screenshot)


def assert_not_blank(screenshot: Path) -> None:
    pixels = imread(screenshot)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    # a page of text, tables and plots: many distinct colours, far from a uniform white
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50
    assert float(pixels[..., :3].std()) > 0.05
