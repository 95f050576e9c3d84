"""Bring your own interpreter: ``python_executable`` (a venv holding sympy) inside the sandbox, both modes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sandbox_support import IS_ROOT, requires_bwrap, start_server, stop_server
from toolrl.tools import ToolConfigError
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.embedded.launch import find_interpreter
from toolrl_sandbox_fusion.models import RunCodeRequest, RunStatus
from toolrl_sandbox_fusion.tool import CodeInterpreterTool

CODE = "import sympy; print(sympy.sqrt(8))"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv holding sympy, whatever the base interpreter has: made from this interpreter's base, with
    this environment's sympy (and mpmath, which it imports) copied into its own site-packages, so the
    sandbox mounts nothing but the venv and the base. Under pytest's root-only tmp folder, so
    bubblewrap must reach it through the staging mounts."""
    sympy = pytest.importorskip("sympy", reason="sympy (from math-verify) is not installed here")
    import mpmath

    folder = tmp_path_factory.mktemp("sympy") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for package in (sympy, mpmath):
        # With its compiled modules (copytree keeps the sources' times, so they stay valid): the venv is
        # mounted read-only, and compiling sympy on each import takes past the run's 10 s limit on a
        # loaded machine.
        source = Path(package.__file__).parent
        shutil.copytree(source, Path(site) / source.name, ignore=shutil.ignore_patterns("tests"))
    (folder.parent / "neighbour.txt").write_text("not mounted")
    return folder


MODES = [
    pytest.param("bwrap", marks=requires_bwrap),
    pytest.param("unshare", marks=pytest.mark.skipif(not IS_ROOT, reason="the fallback isolates fully only as root")),
]


@pytest.mark.parametrize("isolation", MODES)
def test_venv_python_runs_sympy_in_the_sandbox(venv, isolation):
    code = (f"{CODE}\nimport os, sys\nprint(sys.prefix, os.getuid())\n"
            f"for path in ({__file__!r}, {str(venv.parent / 'neighbour.txt')!r}):\n"
            "    print(os.path.exists(path))\n"
            f"print(os.statvfs({str(venv)!r}).f_flag & os.ST_RDONLY)")
    with EmbeddedSandbox(SandboxConfig(isolation=isolation, pool_size=1, interpreter=str(venv / "bin" / "python"))) as sb:
        r = sb.run(RunCodeRequest(code=code, language="python"))
        assert sb.mode == isolation
    # sympy from the venv; neither this checkout nor the venv's neighbours are there; mounted read-only.
    assert r.run_result.stdout.splitlines() == ["2*sqrt(2)", f"{venv} 65534", "False", "False", "1"]


def test_prefix_folder_is_accepted_and_mounts_only_prefixes(venv):
    interpreter = find_interpreter(str(venv))
    assert interpreter.path == str(venv / "bin" / "python3")
    assert str(venv) in interpreter.mounts
    assert not any(m.startswith(("/usr/", "/work")) or m == "/usr" for m in interpreter.mounts)


def test_cli_tool_call_prints_sympy_result(venv):
    proc = subprocess.run(
        [sys.executable, "-m", "toolrl", "tool", "call", "code_interpreter", json.dumps({"code": CODE}),
         "--config", json.dumps({"python_executable": str(venv / "bin" / "python")})],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2*sqrt(2)"


def test_serve_with_python_executable(venv):
    srv = start_server("--python-executable", str(venv), "--pool-size", "1")
    try:
        body = httpx.post(f"{srv.url}/run_code", json={"code": CODE, "language": "python"}, timeout=60).json()
    finally:
        stop_server(srv)
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "2*sqrt(2)\n"


def test_default_interpreter_has_no_sympy_and_says_so(sandbox):
    if sandbox.interpreter.path.startswith("/usr/") and subprocess.run(
            [sandbox.interpreter.path, "-c", "import sympy"], capture_output=True).returncode == 0:
        pytest.skip("the system Python here has sympy")
    r = sandbox.run(RunCodeRequest(code=CODE, language="python"))
    assert r.status == RunStatus.Failed and "No module named 'sympy'" in r.run_result.stderr


def test_bad_python_executable(tmp_path):
    with pytest.raises(ToolConfigError, match="python_executable"):
        CodeInterpreterTool({"python_executable": str(tmp_path / "missing")})
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    broken.chmod(0o755)
    with EmbeddedSandbox(SandboxConfig(isolation="unshare", interpreter=str(broken))) as sb:
        r = sb.run(RunCodeRequest(code="print(1)", language="python"))
    assert r.status == RunStatus.SandboxError and "broken" in r.message and "exit 3" in r.message
