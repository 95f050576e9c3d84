"""The core's layering, checked on every import in ``core/toolrl`` (module level, inside functions and
under ``TYPE_CHECKING`` alike): a module imports only its own layer and the layers below it, the
rules between packages of one layer hold, and no import circle exists, between modules or packages.

The table below is the one in docs/architecture.md ("Layers"); a test keeps the two the same.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "toolrl"

# Lowest first: (layer, the top-level modules and packages of core/toolrl it holds).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("__init__", "hookspecs", "schemas", "config", "cache", "masks", "images", "tiny_settings",
                    "vision_processor", "templates", "trajectory", "seeds", "run_dir", "gc_policy", "children",
                    "ray_cluster")),
    ("modeling", ("modeling",)),
    ("plugin system", ("plugins",)),
    ("parts", ("parsers", "rewards", "tools", "engines", "model_sources", "algorithms", "loggers", "environments",
               "families", "renderers", "sessions", "context", "transports", "agents", "agent_roles",
               "curricula")),
    ("loop and step", ("data", "rollout", "training", "gateway")),
    ("processes", ("processes",)),
    ("entry points", ("cli", "__main__", "testing", "plugin_support")),
]
# Packages that must not import each other (importer, imported): within one layer, and engines and training.
FORBIDDEN = [
    ("training", "rollout"),  # the trainer reads trajectories (toolrl.trajectory), never the agent loop
    ("training", "data"),
    ("data", "rollout"),
    ("data", "training"),
    ("gateway", "rollout"),  # the loop runs an agent's episode through the gateway, never the other way
    ("gateway", "training"),
    ("gateway", "data"),
    ("engines", "tools"),
    ("engines", "training"),  # what both take of a torch model is modeling's: neither imports the other
    ("training", "engines"),
    ("parsers", "tools"),
]
# Modules that must not reach another through any chain of imports (importer, imported).
APART = [
    ("toolrl.processes.step_group", "toolrl.processes.rollout_workers"),  # the public step: no engines, no tools
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(CORE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """Every toolrl module ``name`` imports, wherever the import statement stands."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "toolrl"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "toolrl":
                continue
            # ``from package import module`` depends on that module; any other name, on ``target``.
            submodules = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES}
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(target)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports(name) for name in MODULES}


def top(name: str) -> str:
    """The top-level module or package of core/toolrl that ``name`` belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


LAYER_OF = {member: i for i, (_, members) in enumerate(LAYERS) for member in members}


def test_every_module_has_a_layer():
    assert sorted({top(m) for m in MODULES} - set(LAYER_OF)) == []


def test_imports_point_down_the_layers():
    upward = [f"{m} -> {i} ({LAYERS[LAYER_OF[top(m)]][0]} imports {LAYERS[LAYER_OF[top(i)]][0]})"
              for m, targets in GRAPH.items() for i in sorted(targets) if LAYER_OF[top(i)] > LAYER_OF[top(m)]]
    assert upward == []


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_packages_of_one_layer_keep_apart(importer, imported):
    assert [f"{m} -> {i}" for m, targets in GRAPH.items() if top(m) == importer
            for i in sorted(targets) if top(i) == imported] == []


def reached(name: str) -> set[str]:
    """Every toolrl module that ``name`` imports, directly or through others."""
    seen, todo = {name}, [name]
    while todo:
        for target in GRAPH[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen - {name}


@pytest.mark.parametrize(("importer", "imported"), APART)
def test_modules_kept_apart_do_not_reach_each_other(importer, imported):
    assert imported not in reached(importer)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_between_modules():
    assert cycles(GRAPH) == []


def test_no_import_circle_between_packages():
    packages: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        packages.setdefault(top(m), set()).update(top(i) for i in targets if top(i) != top(m))
    assert cycles(packages) == []


def test_the_cycle_finder_finds_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_architecture_doc_shows_the_same_layers():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Layers", 1)[1].split("| layer |", 1)[1].split("\n\n", 1)[0]
    documented = []
    for row in table.splitlines()[2:]:  # after the header's rest and the |---| line
        cells = [c.strip() for c in row.strip("|").split("|")]
        documented.append((cells[0], tuple(re.findall(r"`([\w]+)/?`", cells[1]))))
    assert documented == list(reversed(LAYERS))
