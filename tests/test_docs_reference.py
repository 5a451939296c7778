"""docs/performance.md and docs/attacks.md are references, and what links into the docs resolves.

A benchmark, attack or defense registered without its section in these docs fails here, and so does a
link or a quoted section name (`docs/X.md, "Section"`) that names no heading of its file. The lists come
from the registries themselves, so nothing here needs updating when one is added."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vflnet.registry import ATTACKS, DEFENSES
from vflnet.tools.bench import BENCHMARKS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PERFORMANCE_MAX_LINES = 600  # issue 58: a reference, not a diary


def headings(path: Path) -> list[str]:
    """The Markdown headings of ``path``, without their leading ``#``s (code blocks left out)."""
    found, in_code = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of ``path``'s headings: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``; a repeated anchor gets ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(path):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def builtin_names(registry) -> list[str]:
    """The registry's entries that vflnet ships (test plug-ins register into the same registry)."""
    return [name for name, entry in registry.all().items() if entry.__module__.startswith("vflnet.")]


def test_performance_is_a_reference_under_its_line_limit():
    lines = (DOCS / "performance.md").read_text().splitlines()
    assert len(lines) < PERFORMANCE_MAX_LINES, f"docs/performance.md has {len(lines)} lines"


@pytest.mark.parametrize("doc", ["performance.md", "attacks.md"])
def test_reference_sections_are_not_dated_diary_entries(doc):
    dated = [h for h in headings(DOCS / doc) if re.search(r"\d{4}-\d{2}-\d{2}|\bsession \d", h)]
    assert not dated, f"docs/{doc}: dated sections belong in git history: {dated}"


def test_every_benchmark_has_a_section_naming_its_command():
    text = "\n".join(headings(DOCS / "performance.md"))
    missing = [n for n in BENCHMARKS if not re.search(rf"`vflnet bench {re.escape(n)}`", text)]
    assert not missing, f"docs/performance.md has no section headed `vflnet bench NAME` for {missing}"


def test_every_attack_and_defense_has_a_section():
    named = {n for h in headings(DOCS / "attacks.md") for n in re.findall(r"`([^`]+)`", h)}
    for registry in (ATTACKS, DEFENSES):
        missing = [n for n in builtin_names(registry) if n not in named]
        assert not missing, f"docs/attacks.md has no section headed `NAME` for the {registry.kind}s {missing}"


def referring_files() -> list[Path]:
    return [
        *DOCS.glob("*.md"),
        REPO / "README.md",
        *(REPO / "vflnet").rglob("*.py"),
        *(REPO / "tests").rglob("*.py"),
        *(REPO / "scripts").rglob("*.py"),
    ]


def test_links_into_the_docs_name_a_heading():
    broken = []
    for path in referring_files():
        text = path.read_text()
        for target, anchor in re.findall(r"\]\(([\w-]*\.md)?#([^)\s]+)\)", text):
            doc = DOCS / target if target else path
            if doc.parent == DOCS and doc.exists() and anchor not in anchors(doc):
                broken.append(f"{path.relative_to(REPO)}: {target}#{anchor}")
    assert not broken, "links to no heading:\n" + "\n".join(broken)


def test_quoted_section_names_name_a_heading():
    """`docs/performance.md, "Step time over a network"`: the quoted words are (part of) a heading of
    that file, whatever the case; a quote broken over lines counts as one."""
    broken = []
    for path in referring_files():
        text = re.sub(r"\s+", " ", path.read_text())
        for target, quoted in re.findall(r"([\w-]+\.md)[,:]? \"([^\"]{3,80})\"", text):
            doc = DOCS / target
            if not doc.exists():
                continue
            if not any(quoted.strip("`").lower() in h.lower() for h in headings(doc)):
                broken.append(f'{path.relative_to(REPO)}: {target}, "{quoted}"')
    assert not broken, "quoted section names that no heading holds:\n" + "\n".join(broken)
