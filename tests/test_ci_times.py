"""scripts/ci_times.py: the table scripts/test.sh ends with, from the files the nox sessions leave."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ci_times", ROOT / "scripts" / "ci_times.py")
ci_times = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ci_times)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_quick" file="tests/test_a.py" time="0.5"/>
<testcase classname="tests.test_a" name="test_slow" file="tests/test_a.py" time="42.0"/>
<testcase classname="tests.test_b" name="test_broken" file="tests/test_b.py" time="3.0"><failure message="x"/></testcase>
<testcase classname="tests.test_b" name="test_skipped" file="tests/test_b.py" time="0.0"><skipped message="y"/></testcase>
</testsuite></testsuites>"""


def session(folder: Path, slug: str, name: str, start: float, end: float, ok: bool = True) -> None:
    (folder / f"{slug}.json").write_text(json.dumps({"session": name, "start": start, "end": end, "ok": ok}))


def test_sessions_get_the_lane_that_came_free_and_the_slowest_tests_their_session(tmp_path):
    session(tmp_path, "wheels", "wheels", 0, 10)
    session(tmp_path, "lint", "lint", 1, 3)
    session(tmp_path, "tests_fast", "tests(fast)", 3.5, 100, ok=False)  # lint's lane came free at 3
    session(tmp_path, "plugin_mcp", "plugin(mcp)", 11, 50)  # wheels' lane came free at 10
    session(tmp_path, "dist", "dist", 52, 60)
    (tmp_path / "tests_fast.xml").write_text(JUNIT)
    out = ci_times.table(tmp_path).splitlines()
    lanes = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in out if line.startswith("| ") and " | " in line}
    assert lanes["wheels"] == lanes["plugin(mcp)"] == lanes["dist"] != lanes["lint"] == lanes["tests(fast)"]
    assert "| 42.0 | tests(fast) | tests/test_a.py::test_slow | passed |" in out
    assert out.index("| 42.0 | tests(fast) | tests/test_a.py::test_slow | passed |") < \
        out.index("| 3.0 | tests(fast) | tests/test_b.py::test_broken | failure |")
    assert "| tests(fast) | 2 | 96 | 4 | 46 | FAILED |" in out
    assert out[-3:] == ["5 sessions, 1 failed: tests(fast)", "tests: 2 passed, 1 failed, 1 skipped", "ci wall: 100 s"]


def test_an_empty_folder_says_so(tmp_path):
    assert ci_times.table(tmp_path) == f"no session times in {tmp_path}"
