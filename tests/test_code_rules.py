"""The project's code rules that a machine can check: no function in ``core/`` or a plugin's package over
80 lines and no class over 300; attention implementations registered with transformers and switched in one
module; one call of ``ray.init``; no ``asyncio.wait_for`` in library code; ``run`` names a resolved run alone; rollout groups typed;
the generic step and batches free of distillation's names."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "toolrl"
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300
ATTENTION_INSTALLER = CORE / "modeling" / "attention.py"


def library_files() -> list[Path]:
    """The library's sources: core and every plugin's import package (not its tests or build output)."""
    root = CORE.parents[1]
    plugins = [path for path in root.glob("plugins/*/toolrl_*/**/*.py")
               if not {"build", "tests"} & set(path.relative_to(root).parts[2:])]
    return sorted([*CORE.rglob("*.py"), *plugins])


def too_long(kinds: tuple[type[ast.AST], ...], limit: int) -> list[str]:
    """The definitions of ``kinds`` over ``limit`` lines, each as ``path:line name (n lines)``, the path
    from the repository root."""
    root = CORE.parents[1]
    return [f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)"
            for path in library_files() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, kinds) and (lines := node.end_lineno - node.lineno + 1) > limit]


def test_no_function_is_over_80_lines():
    long = too_long((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES)
    assert not long, "split these along their own comments: " + "; ".join(long)


def test_no_class_is_over_300_lines():
    long = too_long((ast.ClassDef,), MAX_CLASS_LINES)
    assert not long, "split these into parts of their own: " + "; ".join(long)


def attention_changes(tree: ast.AST) -> list[int]:
    """Lines that register an attention function with transformers (``AttentionInterface.register``,
    ``ALL_MASK_ATTENTION_FUNCTIONS.register``, in any spelling of the two) or set a config's
    ``_attn_implementation``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register":
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("AttentionInterface", "ALL_MASK_ATTENTION_FUNCTIONS", "ALL_ATTENTION_FUNCTIONS"):
                found.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        found += [t.lineno for t in targets if isinstance(t, ast.Attribute) and t.attr == "_attn_implementation"]
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and any(
                isinstance(a, ast.Constant) and a.value == "_attn_implementation" for a in node.args):
            found.append(node.lineno)
    return found


def test_attention_implementations_are_installed_in_one_module():
    """modeling/attention.py holds toolrl's attention implementations in one table and is the one module
    that registers them with transformers or switches a model to one: a newcomer adds a row there."""
    elsewhere = [f"{path.relative_to(CORE.parent)}:{line}" for path in sorted(CORE.rglob("*.py"))
                 if path != ATTENTION_INSTALLER for line in attention_changes(ast.parse(path.read_text()))]
    assert elsewhere == [], "install attention through toolrl.modeling.attention: " + "; ".join(elsewhere)
    assert len(attention_changes(ast.parse(ATTENTION_INSTALLER.read_text()))) == 3  # the scan sees the installer's


def test_one_module_starts_or_joins_ray():
    """``toolrl.ray_cluster.init_ray`` is the one call of ``ray.init`` in the library (its retry of a local
    node that timed out starting, its defaults, in one place)."""
    root = CORE.parents[1]
    found = [f"{path.relative_to(root)}:{node.lineno}" for path in library_files()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init"
             and getattr(node.func.value, "id", "") in ("ray", "ray_module")]
    assert [f.split(":")[0] for f in found] == ["core/toolrl/ray_cluster.py"], (
        "connect through toolrl.ray_cluster.init_ray: " + "; ".join(found))


def test_no_library_code_bounds_an_await_with_wait_for():
    """On Python 3.11 ``asyncio.wait_for`` returns a result that is ready when a cancellation arrives and
    drops the cancellation (a Ctrl-C or a cancelled trajectory then runs on): time limits use
    ``asyncio.timeout``, which does not."""
    root = CORE.parents[1]
    found = [f"{path.relative_to(root)}:{node.lineno}" for path in library_files()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "wait_for"
             and isinstance(node.value, ast.Name) and node.value.id == "asyncio"]
    assert not found, "use `async with asyncio.timeout(...)`: " + "; ".join(found)


def test_rollout_groups_travel_typed():
    """A step's rollouts are a ``RolloutGroup`` wherever they are passed: never a parameter
    ``rollout``/``rollouts`` typed ``Any``."""
    untyped = [f"{path.relative_to(CORE.parent)}:{node.lineno} {node.arg}"
               for path in sorted(CORE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.arg) and node.arg in ("rollout", "rollouts")
               and isinstance(node.annotation, ast.Name) and node.annotation.id == "Any"]
    assert not untyped, "annotate with RolloutGroup: " + "; ".join(untyped)


def run_bindings(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` binds the name ``run`` (or an attribute ``.run``) to anything but a resolved run: a
    parameter, variable or field annotated other than ``ResolvedRun``; an assignment from other than
    ``resolve_run(...)`` or another's ``.run``; a loop, ``with``, walrus or lambda target."""
    def resolved(value: ast.expr) -> bool:
        return ((isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "resolve_run")
                or (isinstance(value, ast.Attribute) and value.attr == "run"))

    def named(target: ast.AST) -> bool:
        return ((isinstance(target, ast.Name) and target.id == "run")
                or (isinstance(target, ast.Attribute) and target.attr == "run"))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == "run":
            if node.annotation is None or ast.unparse(node.annotation) != "ResolvedRun":
                found.append((node.lineno, f"parameter run: {ast.unparse(node.annotation) if node.annotation else '-'}"))
        elif isinstance(node, ast.AnnAssign) and named(node.target) and ast.unparse(node.annotation) != "ResolvedRun":
            found.append((node.lineno, f"run: {ast.unparse(node.annotation)}"))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts, strict=False)
                         if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(t, None) for t in target.elts] if isinstance(target, ast.Tuple) else [(target, node.value)])
                found += [(node.lineno, f"run = {ast.unparse(v) if v else '...'}"[:90]) for t, v in pairs
                          if named(t) and (v is None or not resolved(v))]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension, ast.NamedExpr, ast.withitem)):
            target = node.optional_vars if isinstance(node, ast.withitem) else node.target
            if target is not None and any(named(n) for n in ast.walk(target)):
                found.append((getattr(node, "lineno", 0), f"{type(node).__name__} target run"))
    return found


def test_run_names_a_resolved_run_alone():
    """``run`` means one thing in core: the :class:`toolrl.processes.resolve.ResolvedRun`. The run's facts
    (``RunFacts``, what a part's ``check_run`` sees) are ``facts``, a session's run ``session_run``, a guarded
    call's result ``outcome``; a parameter, variable or attribute named ``run`` holds a resolved run alone."""
    found = [f"{path.relative_to(CORE.parent)}:{line} {what}" for path in sorted(CORE.rglob("*.py"))
             for line, what in run_bindings(ast.parse(path.read_text()))]
    assert not found, "name these for what they hold: " + "; ".join(found)


def test_the_generic_step_and_batches_name_no_distillation():
    """A part declares the fields it reads (``reads``/``fields``): the step, the batches and the pure
    estimators carry them without naming the teacher, and the estimators start no client, thread or engine."""
    for module in ("training/step.py", "data/batches.py"):
        text = (CORE / module).read_text().lower()
        assert not [w for w in ("teacher", "opd", "vopd") if w in text], module
    for path in sorted((CORE / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in ("aiohttp", "httpx", "requests", "urllib", "threading",
                                                           "concurrent") or n.startswith("toolrl.engines")]
            assert not bad, f"{path.name}:{node.lineno} imports {bad}"
