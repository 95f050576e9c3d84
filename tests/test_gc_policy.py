"""The rollout process's collector policy (toolrl.gc_policy), in a fresh interpreter each: it
changes the whole process. What start-up left alive is frozen (no later collection walks it), the
youngest generation's threshold is raised, and only the first call acts."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import gc
from toolrl.gc_policy import YOUNG_THRESHOLD, after_startup

gc.set_threshold({young}, 10, 10)
built = [[i] for i in range(1000)]  # what start-up built
after_startup()
frozen = gc.get_freeze_count()
walked = set(map(id, gc.get_objects()))  # what collections walk: not the permanent generation
assert frozen >= 1000 and not any(id(b) in walked for b in built), frozen
assert gc.get_threshold() == ({expected}, 10, 10), gc.get_threshold()
later = [[i] for i in range(1000)]  # a trajectory's: not frozen, even when asked again
gc.set_threshold(50, 10, 10)
after_startup()
walked = set(map(id, gc.get_objects()))
assert gc.get_freeze_count() == frozen and all(id(b) in walked for b in later)
assert gc.get_threshold() == (50, 10, 10)
print("ok")
"""


@pytest.mark.parametrize(("young", "expected"), [(700, "YOUNG_THRESHOLD"), (10**6, 10**6), (0, 0)])
def test_after_startup_freezes_once_and_raises_the_young_threshold(young: int, expected: object) -> None:
    result = subprocess.run([sys.executable, "-c", CHECK.format(young=young, expected=expected)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
