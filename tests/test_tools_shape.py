"""The tools wing stays readable: no function in vflnet/tools over MAX_LINES lines unless a comment on
its ``def`` line says why (``# long: REASON``). A long function is split into named steps instead."""

from __future__ import annotations

import ast

from tests.conftest import REPO

MAX_LINES = 80


def test_no_tool_function_is_long_without_a_reason() -> None:
    long = []
    for path in sorted((REPO / "vflnet" / "tools").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            size = node.end_lineno - node.lineno + 1
            if size > MAX_LINES and "# long: " not in lines[node.lineno - 1]:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({size} lines)")
    assert long == []
