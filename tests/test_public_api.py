"""The public plugin API is a tested contract: ``toolrl.testing.PUBLIC_API`` is what docs/plugins.md
lists, every name in it exists, and every in-tree plugin's package imports nothing else from toolrl
(the plugins are the proof that an outside author can do everything through it)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

from toolrl.testing import PUBLIC_API, check_public_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in ROOT.glob("plugins/*/toolrl_*") if p.is_dir())


def documented_rows() -> list[tuple[str, list[str], str]]:
    """docs/plugins.md's "Public import paths" table: (path, names, what an author uses them for) per row."""
    text = (ROOT / "docs/plugins.md").read_text()
    section = text[text.index("## Public import paths"):text.index("## Loading, attribution and failures")]
    rows = [line.split(" | ", 2) for line in section.splitlines() if line.startswith("| `")]
    return [(row[0].strip("| `"), re.findall(r"`([^`]+)`", row[1]), row[2].removesuffix("|").strip()) for row in rows]


def documented_api() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for module, names, _ in documented_rows():
        found.setdefault(module, set()).update(names)
    return found


def test_every_in_tree_plugin_package_imports_only_the_public_api() -> None:
    """... and toolrl.plugin_support, the core's internals in-tree plugins take, which no other may."""
    import toolrl.plugin_support

    assert len(PACKAGES) >= 11  # every plugin: none slipped out of the glob
    in_tree = {**PUBLIC_API, "toolrl.plugin_support": frozenset(toolrl.plugin_support.__all__)}
    assert check_public_imports(PACKAGES, in_tree) == []
    assert "toolrl.plugin_support" not in PUBLIC_API


def test_the_tinker_service_trains_through_the_public_step_alone(tmp_path: Path) -> None:
    """The Tinker plugin is an outside trainer: its package passes the table itself (no plugin_support),
    and the table lists none of the trainer's internals (packing, log-probs, the loss), so the plugin
    reaching for them again fails."""
    package = ROOT / "plugins" / "tinker" / "toolrl_tinker"
    assert package in PACKAGES and check_public_imports([package]) == []
    assert sorted({"toolrl.training.step", "toolrl.training.packing"} & set(PUBLIC_API)) == []
    reaching = tmp_path / "trainer.py"
    reaching.write_text((package / "trainer.py").read_text() + "from toolrl.training.step import policy_loss\n")
    assert [p.split(": ", 1)[1] for p in check_public_imports([reaching])] == [
        "from toolrl.training.step import policy_loss: toolrl.training.step is not a public module"]


def test_plugin_support_gives_each_name_from_its_home_with_a_reason() -> None:
    """Every name resolves (imported on first use) to the core's own object, and the module's docstring
    says why an in-tree plugin takes it."""
    import toolrl.plugin_support as support

    for name in support.__all__:
        home = importlib.import_module(support._HOMES[name])
        assert getattr(support, name) is getattr(home, name)
        assert f"``{name}``" in support.__doc__
    assert sorted(support._HOMES) == sorted(support.__all__)


def test_the_testing_kit_gives_each_listed_name_from_its_submodule() -> None:
    """toolrl.testing imports its names on first use: each one in __all__ has a submodule, and nothing else."""
    import toolrl.testing as kit

    assert sorted(kit._HOME) == sorted(kit.__all__)
    for name in kit.__all__:
        assert getattr(kit, name) is getattr(importlib.import_module(f"toolrl.testing.{kit._HOME[name]}"), name)


def test_the_docs_list_exactly_the_public_api() -> None:
    assert documented_api() == {module: set(names) for module, names in PUBLIC_API.items()}


def test_every_public_name_is_documented_for_authors() -> None:
    """Each name sits in one row of the docs' table, beside the few it goes with, and the row says in
    words what an author uses them for: a module's names in one heap, or a bare list, fails."""
    rows = documented_rows()
    listed = [(module, name) for module, names, _ in rows for name in names]
    assert sorted(n for n in set(listed) if listed.count(n) > 1) == []
    assert [(module, names) for module, names, _ in rows if not 1 <= len(names) <= 8] == []
    assert [(module, what) for module, _, what in rows if len(re.sub(r"`[^`]*`", "", what).split()) < 5] == []


def test_every_class_a_hook_names_is_public() -> None:
    """A hook's documentation (hookspecs.py, docs/plugins.md's "Hooks") tells an author which classes to
    subclass or read: each is importable from a public path, or an outside part of that kind could not
    pass check_public_imports."""
    import toolrl.hookspecs

    named = set(re.findall(r":class:`~?(toolrl(?:\.\w+)*)\.(\w+)`", Path(toolrl.hookspecs.__file__).read_text()))
    text = (ROOT / "docs/plugins.md").read_text()
    hooks = text[text.index("## Hooks"):text.index("## Adding an environment session")]
    named |= set(re.findall(r"`(toolrl(?:\.\w+)*)\.([A-Z]\w*)`", hooks))
    assert len(named) >= 25
    public = {(module, name) for module, names in PUBLIC_API.items() for name in names}
    assert sorted(named - public) == []


def test_every_public_name_exists() -> None:
    missing = [f"{module}.{name}" for module, names in PUBLIC_API.items()
               for name in sorted(names) if not hasattr(importlib.import_module(module), name)]
    assert missing == []


def top_level_definitions(text: str) -> set[str]:
    """The names a module's own code binds at its top level (also inside a top-level ``if`` or ``try``):
    ``def``, ``class`` and assignments; an ``import`` binds a name but defines nothing."""
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for handler in node.handlers:
                    walk(handler.body)

    walk(ast.parse(text).body)
    return found


def test_the_definition_check_tells_a_definition_from_an_import() -> None:
    text = ("from toolrl.plugins.parts import RunFacts\nimport json\nfrom typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from toolrl.config import Config\nclass Check: ...\ndef check(): ...\n"
            "async def later(): ...\nLIMIT = 3\nKINDS: tuple[str, ...] = ()\na, (b, c) = 1, (2, 3)\n"
            "try:\n    import tomllib as toml\nexcept ImportError:\n    toml = None\n")
    assert top_level_definitions(text) == {"Check", "check", "later", "LIMIT", "KINDS", "a", "b", "c", "toml"}


def test_every_public_name_is_defined_in_the_module_that_lists_it() -> None:
    """The table names each name's home, so a reader (and an author's "go to definition") finds it where
    the table says: a name listed under a module is defined in that module's own code, not imported into
    it from another (RunFacts was listed under toolrl.processes.run_check, which imports it from
    toolrl.plugins.parts). A package's ``__init__`` is the one exception: it is the package's face and may
    gather names from its modules or elsewhere (``toolrl.hookimpl``, the testing kit's lazy names)."""
    imported = []
    for module, names in sorted(PUBLIC_API.items()):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        if spec.submodule_search_locations is not None:  # a package: its __init__ may re-export
            continue
        defined = top_level_definitions(Path(spec.origin).read_text(encoding="utf-8"))
        imported += [f"{module}.{name}" for name in sorted(names - defined)]
    assert imported == [], "list each name under the module that defines it"


def test_internal_imports_are_found_with_their_line(tmp_path: Path) -> None:
    """Every way of reaching past the table: a private module, a private name of a public module, a
    module import, attribute access on an imported module, an import inside a function."""
    (tmp_path / "plugin.py").write_text(
        "import toolrl\n"
        "import toolrl.rollout.routes\n"
        "from toolrl import model_sources\n"
        "from toolrl.tools import Tool, ToolOptions\n"
        "from toolrl.engines.build import build_engine\n"
        "from toolrl_other.x import y\n"
        "version = toolrl.__version__\n"
        "tokenizer = model_sources.qwen_tokenizer('qwen3')\n"
        "path = model_sources.model_path\n"
        "def later():\n"
        "    from toolrl.cli.errors import UsageFailure\n"
        "    return toolrl.config.DEFAULT_PARSER\n")
    where = tmp_path / "plugin.py"
    assert check_public_imports([tmp_path]) == [
        f"{where}:2: import toolrl.rollout.routes: not a public module",
        f"{where}:4: from toolrl.tools import ToolOptions: ToolOptions is not public in toolrl.tools",
        f"{where}:5: from toolrl.engines.build import build_engine: toolrl.engines.build is not a public module",
        f"{where}:8: toolrl.model_sources.qwen_tokenizer: qwen_tokenizer is not public in toolrl.model_sources",
        f"{where}:11: from toolrl.cli.errors import UsageFailure: toolrl.cli.errors is not a public module",
        f"{where}:12: toolrl.config.DEFAULT_PARSER: DEFAULT_PARSER is not public in toolrl.config",
    ]
