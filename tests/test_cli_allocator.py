"""``toolrl`` puts torch's large CPU allocations on transparent huge pages for the processes a run starts,
unless the user has set ``THP_MEM_ALLOC_ENABLE`` (docs/benchmarks.md, "CPU allocations"); so do the tests."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
from toolrl.cli import main


@pytest.mark.parametrize(("given", "kept"), [(None, "1"), ("0", "0")])
def test_the_command_line_turns_huge_page_allocations_on_unless_the_user_set_them(monkeypatch, given, kept):
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "unset")  # restored after the test, whatever main() does
    if given is None:
        monkeypatch.delenv("THP_MEM_ALLOC_ENABLE")
    else:
        monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", given)
    monkeypatch.setattr(sys, "argv", ["toolrl", "--help"])
    with pytest.raises(SystemExit, match="0"):
        main()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == kept


def test_every_test_process_runs_with_huge_page_allocations():
    """The suite's own processes too (noxfile.py's ``TEST_ENV``): a cold CI run took 1,364 s without it, 945 s
    with it (docs/testing.md, "Torch's CPU allocations on huge pages")."""
    tree = ast.parse((Path(__file__).resolve().parent.parent / "noxfile.py").read_text())
    env = next(ast.literal_eval(node.value) for node in tree.body
               if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["TEST_ENV"])
    assert env["THP_MEM_ALLOC_ENABLE"] == "1" and env["OMP_NUM_THREADS"] == "1"
