"""scripts/python.sh: the interpreter scripts/test.sh and scripts/setup_demo.sh make their venvs from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = os.path.realpath(sys.executable)


def chosen(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # A PATH whose python3.11 and python3 are a Python of its own (a stand-in for pyenv's shims).
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    for name in ("python3.11", "python3"):
        (shims / name).unlink(missing_ok=True)
        (shims / name).symlink_to(sys.executable)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TOOLRL_SYSTEM_PYTHONS")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "python.sh")], capture_output=True, text=True, timeout=60,
                          env={**base, "PATH": f"{shims}:/usr/bin:/bin", **env})


def no_venv(tmp_path: Path) -> str:
    """A Python that cannot make a venv (Debian's without python3-venv answers the check with an error)."""
    fake = tmp_path / "python-without-venv"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    return str(fake)


def test_the_distributions_python_comes_before_paths(tmp_path):
    out = chosen(tmp_path, TOOLRL_SYSTEM_PYTHONS=f"{no_venv(tmp_path)} {sys.executable}")
    assert out.returncode == 0 and out.stdout.strip() == HERE, out.stderr


def test_without_a_usable_distribution_python_paths_is_used_as_its_real_path(tmp_path):
    out = chosen(tmp_path, TOOLRL_SYSTEM_PYTHONS=f"{no_venv(tmp_path)} {tmp_path / 'absent'}")
    assert out.returncode == 0 and out.stdout.strip() == HERE, out.stderr  # the shim resolved to the interpreter


def test_python_set_is_used_or_is_one_line(tmp_path):
    out = chosen(tmp_path, PYTHON=sys.executable, TOOLRL_SYSTEM_PYTHONS=no_venv(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == HERE, out.stderr
    out = chosen(tmp_path, PYTHON=no_venv(tmp_path))  # not passed over for another
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "set PYTHON" in out.stderr and "python-without-venv" in out.stderr


def test_the_setup_scripts_take_their_python_from_it():
    for script in ("test.sh", "setup_demo.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert 'PY="$(bash scripts/python.sh)"' in text and "command -v python3" not in text, script
