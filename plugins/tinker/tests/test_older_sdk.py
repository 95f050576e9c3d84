"""An older SDK release (0.34) against the server, unchanged: the plugin's nox session installs it
into a virtual environment of its own and names its Python in TOOLRL_TINKER_OLD_SDK_PYTHON."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import KEY

OLD = os.environ.get("TOOLRL_TINKER_OLD_SDK_PYTHON")


@pytest.mark.skipif(not OLD, reason="TOOLRL_TINKER_OLD_SDK_PYTHON names no Python with an older tinker SDK")
def test_older_sdk_round_trip(served: Any) -> None:
    assert OLD is not None
    script = Path(__file__).parent / "clients" / "round_trip.py"
    env = {**os.environ, "TINKER_API_KEY": KEY}
    done = subprocess.run([OLD, str(script), served.url], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["sdk"].startswith("0.34")
    assert float(lines["cross_entropy"]) > 0
    assert lines["samples"] == "[4, 4]"
    assert lines["loaded"].endswith(":train:1")
