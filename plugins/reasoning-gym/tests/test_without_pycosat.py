"""Without pycosat (blocked in a fresh interpreter as Python marks a module that cannot be imported,
whether or not it is installed here): reasoning_gym imports, every other generator loads, the zebra
puzzles are one error line before any model loads, and the stand-in solver refuses rather than answers."""

from __future__ import annotations

import json
import subprocess
import sys

from toolrl.testing import listing_imports
from toolrl_reasoning_gym.sat import NEEDS_PYCOSAT

BLOCK = "import sys; sys.modules['pycosat'] = None\n"


def without_pycosat(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True, timeout=120)


def test_listing_the_plugins_leaves_the_interpreter_alone():
    """Every toolrl process lists the plugins: loading this one's entry point imports neither reasoning_gym
    nor pycosat and puts no stand-in in place (that waits for a generator to be built). The listing exits 0
    (listing_imports raises AssertionError, naming the status, for any other) and lists the plugin, loaded."""
    printed, modules = listing_imports("toolrl_reasoning_gym", "reasoning_gym", "pycosat")
    assert modules == ["toolrl_reasoning_gym"]
    [row] = [line.split() for line in printed.splitlines() if line.split()[:1] == ["reasoning_gym"]]
    assert row[1] == "toolrl-plugin-reasoning-gym" and row[3] == "ok", row  # name, distribution, version, status


def test_a_generator_that_needs_pycosat_is_one_line_naming_it(tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text("model: {source: tiny-qwen3}\nenv: reasoning_gym\nenv_options: {dataset: zebra_puzzles}\n")
    done = without_pycosat("from toolrl.cli import cli; cli()", "eval", str(config), "--output", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == "" and done.stderr.splitlines() == [
        f"error: {config}:3: env_options.dataset: reasoning-gym's zebra_puzzles needs pycosat, which is not "
        "installed: pip install pycosat==0.6.6 (it compiles C: needs a C compiler)"]


def test_every_other_generator_loads_and_the_stand_in_refuses_to_solve():
    code = """
import json
import toolrl_reasoning_gym.generators  # puts the stand-in in place
import reasoning_gym, pycosat
from toolrl.data.sources import load_split
from toolrl.environments import get_environment
from toolrl_reasoning_gym.generators import names
env = get_environment("reasoning_gym")
for name in names():
    if name not in NEEDS:
        resolved, options = env.resolve({"dataset": name, "size": 1, "test_size": 1})
        assert len(load_split(resolved, "test", options)) == 1, name
errors = []
for call in (lambda: pycosat.itersolve([[1]]), lambda: pycosat.solve([[1]]),
             lambda: reasoning_gym.create_dataset("zebra_puzzles", seed=0, size=1)[0]):
    try:
        call()
        raise AssertionError("no error")
    except ModuleNotFoundError as exc:
        errors.append([exc.name, str(exc)])
print()  # some generators print: the errors on a line of their own
print(json.dumps(errors))
"""
    done = without_pycosat(f"NEEDS = {sorted(NEEDS_PYCOSAT)!r}\n" + code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == 3 * [[
        "pycosat", "pycosat is not installed (reasoning-gym's zebra_puzzles solves with it): pip install pycosat==0.6.6 "
        "(it compiles C: needs a C compiler)"]]
