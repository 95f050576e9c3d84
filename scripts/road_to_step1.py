"""The road to step 1: which toolrl source files the call path from ``run_training`` to ``start_processes``
enters (issue #58), measured on ``examples/tiny.yaml`` with ``trainer.total_steps=1``, in this process.

    python scripts/road_to_step1.py [-v] [OUTPUT_DIR]      (-v: the climbs too)

It runs the whole training run under ``sys.setprofile`` and looks only at the stretch between the
call of ``toolrl.processes.controller.run_training`` and the call of ``toolrl.processes.start.start_processes``
(what ``prepare_training`` checks before any role is built). The plugins are loaded first, as the
``toolrl`` command loads them before it runs anything (and so that a first screening of them, or one
read from its cache, measures the same). Within the stretch, and on this thread, only frames of
toolrl's own source files (``core/toolrl``) count:

- **files entered**: the distinct files in which a function is called. What runs inside an import
  (a module's body and what it calls) does not count: an import runs once per process, so a file an
  earlier import already ran would otherwise count or not by chance.
- **climbs back**: the calls that return into a different toolrl file than their own, counted once
  per (returning file, file returned to) pair: each is a hop up the road that came down it first.
  A call path that stays in one file until it is done climbs back zero times; one that goes
  A → B → A → C → A climbs back twice (B→A, C→A).

It prints both, the files entered by layer (the core's layers, ``tests/test_layers.py``: the road's own
files are the roles, the plugin system and the loop; the parts layer holds what the road checks, one
module per kind; the foundation what every layer uses), then the files in the order first entered.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_layers import LAYERS  # noqa: E402  (the one table of the core's layers)


def layer(name: str) -> str:
    """The layer of ``name`` (``toolrl/processes/run_check.py``): its top-level module or package's."""
    top = Path(name).parts[1].removesuffix(".py")
    return next(layer for layer, members in LAYERS if top in members)


def measure(output_dir: str) -> tuple[list[str], set[tuple[str, str]]]:
    """The files the road enters, in order, and its climbs back (see the module docstring)."""
    import toolrl
    from toolrl.config import load_config
    from toolrl.plugins import get_plugins
    from toolrl.processes.controller import run_training

    package = Path(toolrl.__file__).resolve().parent
    config = load_config(str(ROOT / "examples" / "tiny.yaml"),
                         ["trainer.total_steps=1", f"trainer.output_dir={output_dir}", "trainer.plot=false"])
    get_plugins()
    names: dict[str, str | None] = {}  # co_filename -> its path under toolrl/, None: not toolrl's
    entered: list[str] = []
    climbs: set[tuple[str, str]] = set()
    state = {"on": False, "done": False, "importing": 0}

    def ours(filename: str) -> str | None:
        if filename not in names:
            path = Path(filename).resolve()
            names[filename] = str(path.relative_to(package.parent)) if path.is_relative_to(package) else None
        return names[filename]

    def caller_file(frame):  # the nearest toolrl frame above this one
        frame = frame.f_back
        while frame is not None and ours(frame.f_code.co_filename) is None:
            frame = frame.f_back
        return None if frame is None else ours(frame.f_code.co_filename)

    def profile(frame, event, arg):
        if state["done"] or event not in ("call", "return"):
            return
        code = frame.f_code
        if event == "call" and not state["on"]:
            state["on"] = code.co_name == "run_training" and ours(code.co_filename) == "toolrl/processes/controller.py"
        if not state["on"]:
            return
        if code.co_name == "<module>":  # a module body runs to its end: no return in between
            state["importing"] += 1 if event == "call" else -1
            return
        if state["importing"]:
            return
        name = ours(code.co_filename)
        if name is None:
            return
        if event == "call":
            if code.co_name == "start_processes" and name == "toolrl/processes/start.py":
                state["done"] = True
                return
            if name not in entered:
                entered.append(name)
        else:
            above = caller_file(frame)
            if above is not None and above != name:
                climbs.add((name, above))

    sys.setprofile(profile)
    try:
        run_training(config, overwrite=True)
    finally:
        sys.setprofile(None)
    return entered, climbs


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "-v"]
    with tempfile.TemporaryDirectory() as tmp:
        entered, climbs = measure(args[0] if args else str(Path(tmp) / "run"))
    print(f"files entered before start_processes: {len(entered)}")
    print(f"climbs back: {len(climbs)}")
    counts = {name: sum(layer(f) == name for f in entered) for name, _ in reversed(LAYERS)}
    print("by layer: " + ", ".join(f"{name} {n}" for name, n in counts.items() if n))
    for name in entered:
        print(f"  {name}")
    if "-v" in sys.argv:
        for low, high in sorted(climbs):
            print(f"  climb {low} -> {high}")


if __name__ == "__main__":
    main()
