"""The map of the code cannot go stale: docs/architecture.md's layout lists every module of core/toolrl and
nothing that is not there, and a package docstring that lists its modules lists all of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "toolrl"
DOC = ROOT / "docs" / "architecture.md"
ENTRY = re.compile(r"^( {2}| {4}| {6})([a-z_0-9]+(?:\.py|/))(?:\s|$)")


def mapped(doc: str) -> set[str]:
    """The modules the layout's code block names, as paths under core/toolrl (a package's line stands for
    its ``__init__.py``; a line indented two more than a package's is in it)."""
    section = doc[doc.index("## The layout"):]
    block = section.split("```", 2)[1]
    found: set[str] = set()
    packages: list[str] = []  # the packages open at each depth
    for line in block.splitlines():
        match = ENTRY.match(line)
        if not match:
            continue
        depth, name = len(match.group(1)) // 2 - 1, match.group(2)
        del packages[depth:]
        path = "".join(packages) + name
        if name.endswith("/"):
            packages.append(name)
            found.add(f"{path}__init__.py")
        else:
            found.add(path)
    return found


def modules(core: Path) -> set[str]:
    return {p.relative_to(core).as_posix() for p in core.rglob("*.py")}


def mismatch(files: set[str], listed: set[str]) -> list[str]:
    return ([f"core/toolrl/{m} has no line in docs/architecture.md's layout" for m in sorted(files - listed)]
            + [f"docs/architecture.md lists core/toolrl/{m}, which does not exist" for m in sorted(listed - files)])


def test_the_layout_lists_every_module_and_only_those() -> None:
    assert mismatch(modules(CORE), mapped(DOC.read_text())) == []


def test_a_module_added_without_its_line_or_a_line_left_behind_is_named() -> None:
    listed = mapped(DOC.read_text())
    files = modules(CORE)
    assert mismatch(files | {"rollout/new_idea.py"}, listed) == [
        "core/toolrl/rollout/new_idea.py has no line in docs/architecture.md's layout"]
    assert mismatch(files - {"rollout/tree.py"}, listed) == [
        "docs/architecture.md lists core/toolrl/rollout/tree.py, which does not exist"]
    assert mismatch(files | {"engines/transformers/new_part.py"}, listed) == [  # a package in a package
        "core/toolrl/engines/transformers/new_part.py has no line in docs/architecture.md's layout"]


def docstring_lists() -> dict[str, set[str]]:
    """Each package whose docstring lists its modules (lines ``- ``name``: ...``) → the names listed."""
    lists = {}
    for init in CORE.glob("*/__init__.py"):
        names = set(re.findall(r"^- ``([a-z_0-9]+)``:", ast.get_docstring(ast.parse(init.read_text())) or "", re.M))
        if names:
            lists[init.parent.name] = names
    return lists


def test_a_package_docstring_that_lists_its_modules_lists_all_of_them() -> None:
    lists = docstring_lists()
    assert lists, "no package docstring lists its modules: the check below would check nothing"
    for package, names in lists.items():
        files = {p.stem for p in (CORE / package).glob("*.py")} - {"__init__"}
        assert names == files, f"toolrl.{package}'s docstring: missing {sorted(files - names)}, " \
                               f"absent {sorted(names - files)}"
