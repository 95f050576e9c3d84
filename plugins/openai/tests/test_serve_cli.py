"""``toolrl serve`` refuses bad input in one line (exit 2), before loading any model."""

from __future__ import annotations

import socket
import subprocess
import sys

from support import REPO, TINY_YAML, env_with


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolrl", "serve", str(TINY_YAML), *args], capture_output=True,
                          text=True, env=env_with(), cwd=REPO, timeout=120)


def test_bad_config_is_one_line() -> None:
    result = _serve("engine.bogus=1")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: override engine.bogus=1: engine.bogus: unknown key"


def test_unknown_engine_is_one_line() -> None:
    result = _serve("engine.name=nope")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: override engine.name=nope: engine.name: unknown rollout engine 'nope'")


def test_taken_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
