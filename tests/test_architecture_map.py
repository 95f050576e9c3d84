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


# A name of toolrl's as prose cites it (``toolrl.rollout.teacher``; one-letter parts are placeholders:
# ``toolrl.a.b``), and a docstring's cross-reference (:func:`toolrl.rollout.run_rollouts`, :class:`.Name`
# relative to its package, :meth:`name` in its own module).
CITED = re.compile(r"(?<![\w./-])toolrl(?:\.(?:[A-Za-z_]\w+|[A-Z]))+(?!\w|\.\w)")
FILE = re.compile(r"\.(?:py|md|json|jsonl|yaml|toml|txt)$")
CROSS = re.compile(r":(?:func|mod|class|meth|data|attr|exc):`~?([\w.]+)`")


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module of toolrl or reached from one by attributes."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("toolrl"):
                return True  # an optional dependency missing here: the name cannot be checked
            continue
        for attribute in parts[i:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _cross_resolves(ref: str, module: str, package: str) -> bool:
    import builtins
    import importlib

    if ref.startswith("toolrl"):
        return _resolves(ref)
    if ref.startswith("."):
        return _resolves(package + ref)
    own = importlib.import_module(module)
    head = ref.split(".")[0]
    if hasattr(own, head) or hasattr(builtins, head):
        return True
    return any(hasattr(value, head) for value in vars(own).values() if isinstance(value, type))  # a method's


def test_every_toolrl_name_the_code_and_docs_cite_exists():
    """A module or function renamed or removed leaves no reference to it behind: every ``toolrl.`` name the
    core, the docs and the plugins cite imports, and every cross-reference of the core's docstrings resolves."""
    stale = []
    for path in sorted(CORE.rglob("*.py")):
        module = ".".join(path.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        text = path.read_text()
        stale += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in CITED.finditer(text)
                  if not FILE.search(m.group(0)) and not _resolves(m.group(0))]
        stale += [f"{path.relative_to(ROOT)}: {ref}" for ref in CROSS.findall(text)
                  if ref.split(".")[0] not in ("click",) and not _cross_resolves(ref, module, package)]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("plugins/*/README.md")),
             *sorted(ROOT.glob("plugins/*/toolrl_*/**/*.py"))]
    for path in pages:
        stale += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in CITED.finditer(path.read_text())
                  if not FILE.search(m.group(0)) and not _resolves(m.group(0))]
    assert not stale, "cited but not there: " + "; ".join(stale)
