"""One name, one home: a public top-level function or class name is defined in one module of
``core/toolrl`` only (beside the code rules of test_code_rules.py). Two definitions of one name make
imports ambiguous and grow apart; a second one imports the first or is renamed to say what it is.
CLI commands count too: a command's function is named ``<command>_command``, not like the function
it calls.

Exempt: hook implementations (``@hookimpl``: pluggy matches them by the hook's name), ``main``,
the conventional entry point of a program (``python -m``, the ``toolrl`` console script), and the one
interface every gateway protocol module implements (``parse``, ``answer``, ``stream``: each module's
:class:`~toolrl.gateway.protocols.GatewayProtocol` binds them)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "toolrl"
ENTRY_POINT = "main"
PROTOCOL = {"parse", "answer", "stream"}
PROTOCOL_MODULES = {f"toolrl/gateway/{name}.py" for name in ("chat_completions", "responses")}


def _hookimpl(node: ast.AST) -> bool:
    return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) == "hookimpl"
               for d in getattr(node, "decorator_list", []))


def definitions(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each public top-level def/class name of ``sources`` (module -> text) and where it is defined."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, text in sorted(sources.items()):
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    not node.name.startswith("_") and node.name != ENTRY_POINT and not _hookimpl(node) and \
                    not (module in PROTOCOL_MODULES and node.name in PROTOCOL):
                found[node.name].append(f"{module}:{node.lineno}")
    return found


def duplicates(sources: dict[str, str]) -> dict[str, list[str]]:
    return {name: places for name, places in definitions(sources).items() if len(places) > 1}


def test_the_check_finds_a_name_defined_twice_and_spares_hooks_and_entry_points():
    sources = {"a.py": "def cache_root(): ...\nclass Route: ...\ndef main(): ...\n",
               "b.py": "from x import hookimpl\n@hookimpl\ndef register_tools(register): ...\n"
                       "def cache_root(d): ...\ndef main(): ...\ndef _private(): ...\n",
               "c.py": "def register_tools(register): ...\nclass Route: ...\ndef _private(): ...\n"}
    assert duplicates(sources) == {"cache_root": ["a.py:1", "b.py:4"], "Route": ["a.py:2", "c.py:2"]}


def test_no_public_name_is_defined_in_two_core_modules():
    sources = {str(p.relative_to(CORE.parent)): p.read_text() for p in CORE.rglob("*.py")}
    found = duplicates(sources)
    assert not found, "one definition per name; import it, or rename what is not the same thing: " + "; ".join(
        f"{name} in {', '.join(places)}" for name, places in sorted(found.items()))
