"""The wheel people outside this repository install carries the license: its text (LICENSE) and its
SPDX expression in the metadata (PEP 639)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO

# what the build reads; copied so that the build's own folders (build/, *.egg-info) stay out of the repo
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "vflnet")


def test_the_wheel_ships_the_license_text_and_its_spdx_expression(tmp_path: Path) -> None:
    src, dist = tmp_path / "src", tmp_path / "dist"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    # the installed setuptools, not a download: the suite runs offline
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            str(dist),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("vflnet-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")).removesuffix("METADATA")
        metadata = zf.read(info + "METADATA").decode().splitlines()
        license_text = zf.read(info + "licenses/LICENSE").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert license_text == (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_readme_pip_recipe_installs_the_pinned_cpu_torch_as_the_setup_script_does() -> None:
    """README's CPU-only pip install names the torch pyproject pins, from the index that
    scripts/install-torch.sh uses, before vflnet itself."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Install with pip (CPU only)\n", 1)[1].split("\n## ", 1)[0]
    (pin,) = re.findall(r'"(torch==[^"]+)"', (REPO / "pyproject.toml").read_text())
    script = (REPO / "scripts" / "install-torch.sh").read_text()
    index = re.search(r"^CPU_INDEX=(\S+)$", script, re.MULTILINE)
    assert index is not None and re.search(r"^TORCH=" + re.escape(pin) + "$", script, re.MULTILINE)
    commands = [line for line in section.splitlines() if line.startswith("pip install")]
    assert commands[0].split("#")[0].split() == ["pip", "install", pin, "--index-url", index.group(1)]
    assert len(commands) == 2 and "torch" not in commands[1].split("#")[0]
