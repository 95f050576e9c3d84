"""The project's code rules that a machine can check: no function in ``core/`` over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "toolrl"
MAX_FUNCTION_LINES = 80


def test_no_core_function_is_over_80_lines():
    long = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(CORE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these along their own comments: " + "; ".join(long)
