"""The flat 0.1 layout's import paths still work, as the same modules, with a warning naming the new path."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from toolrl.moved import MOVED


def test_every_new_path_exists() -> None:
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None, new


@pytest.mark.parametrize("old", ["toolrl.registry", "toolrl.toolconfig", "toolrl.trainer", "toolrl.grpo"])
def test_an_old_path_is_the_new_module_and_warns(old: str) -> None:
    # A fresh interpreter: the warning is given when the old name is first imported.
    code = (
        "import warnings, importlib, sys\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({MOVED[old]!r})\n"
        "assert old is new, (old, new)\n"
        "assert new.__spec__.name == new.__name__, new.__spec__.name\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"{old} is now {MOVED[old]}" in out


def test_from_import_of_an_old_path() -> None:
    code = "from toolrl.registry import RegistryError; from toolrl.plugins.registry import RegistryError as R; assert RegistryError is R"
    subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], check=True)
