"""The plugin's shape, held: nothing waits by polling (a sleep in a loop), no class grows past 300 lines,
a request reaches the service typed, no module imports one that imports it back; and a sampler adapter
in use leaves the engine only when its last request ends, a weight set saved again under its name waiting
for them."""

from __future__ import annotations

import ast
import asyncio
import threading
from pathlib import Path
from typing import Any

from conftest import BASE

PACKAGE = Path(__file__).resolve().parents[1] / "toolrl_tinker"


def _trees() -> list[tuple[str, ast.Module]]:
    return [(path.name, ast.parse(path.read_text())) for path in sorted(PACKAGE.glob("*.py"))]


def test_nothing_polls() -> None:
    """Waiting is on an event, a condition or a future: no ``time.sleep`` or ``asyncio.sleep`` at all."""
    sleeps = [f"{name}:{node.lineno}" for name, tree in _trees() for node in ast.walk(tree)
              if isinstance(node, ast.Call) and "sleep" in (getattr(node.func, "attr", None), getattr(node.func, "id", None))]
    assert sleeps == []


def test_classes_stay_small_and_requests_typed() -> None:
    long = [f"{name}: {node.name} ({node.end_lineno - node.lineno + 1} lines)" for name, tree in _trees()
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= 300]
    assert long == []
    untyped = [f"{name}:{node.lineno}" for name, tree in _trees() for node in ast.walk(tree)
               if isinstance(node, ast.arg) and node.arg == "req"
               and (node.annotation is None or ast.unparse(node.annotation) == "Any")]
    assert untyped == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    """The package's modules are layers: none imports (anywhere in it, ``TYPE_CHECKING`` blocks and
    functions too) a module that imports it, directly or through others."""
    modules = {path.stem: ast.parse(path.read_text()) for path in PACKAGE.glob("*.py")}

    def own(name: str) -> str | None:
        stem = "__init__" if name == "toolrl_tinker" else name.removeprefix("toolrl_tinker.")
        return stem if name.split(".")[0] == "toolrl_tinker" and stem in modules else None

    imports: dict[str, set[str]] = {}
    for stem, tree in modules.items():
        names = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:  # `from toolrl_tinker import x`: module x
                names += [f"{node.module}.{a.name}" if own(f"{node.module}.{a.name}") else node.module
                          for a in node.names]
        imports[stem] = {m for m in map(own, names) if m is not None and m != stem}

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in imports[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    assert sorted(f"{m} imports {i}, which imports it back" for m in imports for i in imports[m] if m in reached(i)) == []


def test_an_adapter_in_use_leaves_when_its_last_request_ends(client: Any, served: Any) -> None:
    tc = client.create_lora_training_client(base_model=BASE, rank=2, seed=21).result()
    tc.save_weights_and_get_sampling_client().result()
    base = served.service.bases[BASE]
    sampler, run = base.sampler, served.service.runs[tc.model_id]
    name = sampler.kept[tc.model_id][-1]
    entered, done = threading.Event(), asyncio.Event()

    async def request() -> None:  # a sample request in flight on the adapter until done is set
        async with sampler.using(name):
            entered.set()
            await done.wait()

    held = asyncio.run_coroutine_threadsafe(request(), served.loop)
    assert entered.wait(30)
    state = base.trainer.adapter_state(run)
    saving = threading.Thread(target=sampler.put, args=(tc.model_id, name, run.rank, run.targets, state))
    saving.start()  # the name saved again: waits for the request
    saving.join(0.5)
    assert saving.is_alive() and sampler.holds(name)
    served.loop.call_soon_threadsafe(done.set)
    held.result(30)
    saving.join(30)
    assert not saving.is_alive() and sampler.holds(name)

    entered.clear()
    done = asyncio.Event()
    held = asyncio.run_coroutine_threadsafe(request(), served.loop)
    assert entered.wait(30)
    sampler.release(tc.model_id)  # the run's weight sets dropped: this one once its request ends
    assert sampler.holds(name)
    served.loop.call_soon_threadsafe(done.set)
    held.result(30)
    assert not sampler.holds(name)
