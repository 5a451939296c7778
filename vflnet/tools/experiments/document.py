"""A small document model that reports and comparisons are built in, and its two renderings:
Markdown (figures as PNG files next to it) and one self-contained HTML page (figures inline as
base64 PNG, styles inline, no external resource)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Text:
    text: str


@dataclass
class Code:
    text: str
    folded: str | None = None  # a summary line: the code shows collapsed under it (<details>)


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class NotDrawn:
    """A figure that could not be drawn; ``why``: e.g. the plots extra is not installed."""

    why: str


@dataclass
class Figure:
    name: str  # file name stem in the Markdown rendering; unique within a document
    png: bytes | NotDrawn  # not drawn: left out of both renderings, which say why once, at the top
    caption: str


@dataclass
class Columns:
    """Two documents side by side (HTML) or one after the other (Markdown)."""

    titles: tuple[str, str]
    left: list[Block]
    right: list[Block]


Block = Heading | Text | Code | Table | Figure | Columns

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; font-size: 0.9em; }
th { background: #f0f0f0; }
summary { cursor: pointer; color: #555; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
figure { margin: 0.5em 0 1.5em; }
figure img { max-width: 100%; border: 1px solid #ddd; }
.columns { display: flex; gap: 2em; align-items: flex-start; }
.columns > div { flex: 1; min-width: 0; }
"""


def to_html(title: str, blocks: list[Block]) -> str:
    body = "\n".join(_html_block(b) for b in blocks)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body>\n</html>\n"
    )


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{html.escape(block.text)}</h{block.level}>"
    if isinstance(block, Text):
        return f"<p>{html.escape(block.text)}</p>"
    if isinstance(block, Code):
        pre = f"<pre>{html.escape(block.text)}</pre>"
        return (
            pre
            if block.folded is None
            else f"<details><summary>{html.escape(block.folded)}</summary>{pre}</details>"
        )
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    if isinstance(block, Figure):
        assert isinstance(block.png, bytes)  # write() leaves out the figures not drawn
        data = base64.b64encode(block.png).decode()
        alt = html.escape(block.caption)
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
            f"<figcaption>{alt}</figcaption></figure>"
        )
    sides = (
        f"<div><h2>{html.escape(t)}</h2>{''.join(_html_block(b) for b in side)}</div>"
        for t, side in zip(block.titles, (block.left, block.right), strict=True)
    )
    return f'<div class="columns">{"".join(sides)}</div>'


def to_markdown(title: str, blocks: list[Block], files_dir: Path) -> str:
    """Markdown; each figure is written to ``files_dir`` and linked relative to its parent."""
    files_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    for block in blocks:
        lines += _markdown_block(block, files_dir)
    return "\n".join(lines)


def _markdown_block(block: Block, files_dir: Path) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + block.text, ""]
    if isinstance(block, Text):
        return [block.text, ""]
    if isinstance(block, Code):
        fenced = ["```", block.text.rstrip("\n"), "```", ""]
        if block.folded is None:
            return fenced
        return [f"<details><summary>{html.escape(block.folded)}</summary>", "", *fenced, "</details>", ""]
    if isinstance(block, Table):
        cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["| " + " | ".join(cell(h) for h in block.header) + " |"]
        lines.append("|" + "---|" * len(block.header))
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in block.rows]
        return [*lines, ""]
    if isinstance(block, Figure):
        assert isinstance(block.png, bytes)  # write() leaves out the figures not drawn
        path = files_dir / f"{block.name}.png"
        path.write_bytes(block.png)
        return [f"![{block.caption}]({files_dir.name}/{path.name})", ""]
    lines: list[str] = []
    for title, side in zip(block.titles, (block.left, block.right), strict=True):
        lines += [f"## {title}", ""]
        for inner in side:
            lines += _markdown_block(inner, files_dir)
    return lines


def not_drawn(blocks: list[Block]) -> list[str]:
    """Why figures of ``blocks`` are not drawn: each reason once, in order of first appearance."""
    whys: list[str] = []
    for b in blocks:
        if isinstance(b, Columns):
            found = not_drawn([*b.left, *b.right])
        else:
            found = [b.png.why] if isinstance(b, Figure) and isinstance(b.png, NotDrawn) else []
        whys += [w for w in found if w not in whys]
    return whys


def _drawn(blocks: list[Block]) -> list[Block]:
    """``blocks`` without the figures not drawn."""
    kept: list[Block] = []
    for b in blocks:
        if isinstance(b, Columns):
            kept.append(Columns(b.titles, _drawn(b.left), _drawn(b.right)))
        elif not (isinstance(b, Figure) and isinstance(b.png, NotDrawn)):
            kept.append(b)
    return kept


def write(out_dir: Path, title: str, blocks: list[Block], stem: str = "report") -> tuple[Path, Path]:
    """``<stem>.md`` (figures in ``<stem>_files/``) and the self-contained ``<stem>.html``; figures not
    drawn are left out, and the top of each says why (once)."""
    blocks = [Text(f"Figures are left out: {why}") for why in not_drawn(blocks)] + _drawn(blocks)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path = out_dir / f"{stem}.md", out_dir / f"{stem}.html"
    md_path.write_text(to_markdown(title, blocks, out_dir / f"{stem}_files"))
    html_path.write_text(to_html(title, blocks))
    return md_path, html_path
