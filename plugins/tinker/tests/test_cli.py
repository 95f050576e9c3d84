"""`toolrl tinker serve` as a user starts it: refusals in one line (exit 2), and a server the SDK reaches;
its options for the server's limits are the limits table's."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _serve(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}
    if key:
        env["TINKER_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "toolrl", "tinker", "serve", *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("args", "key", "says"), [
    ((), None, "an API key is required"),
    pytest.param(("--sampler", "vllm"), "tml-k", "--sampler vllm: vLLM is not installed here",
                 marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")),
])
def test_refusals_are_one_line(args: tuple[str, ...], key: str | None, says: str) -> None:
    done = _serve(*args, key=key)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr and "Traceback" not in done.stderr


def test_serve_takes_its_limits_from_the_table() -> None:
    """Each limit with a help text is an option of `serve` whose default and help are the table's."""
    import click
    import toolrl_tinker
    from toolrl_tinker.limits import Limits

    cli = click.Group("toolrl")
    toolrl_tinker.register_commands(cli=cli)
    options = {p.name: p for p in cli.commands["tinker"].commands["serve"].params}
    table = [f for f in dataclasses.fields(Limits) if "help" in f.metadata]
    assert len(table) == 12
    assert [(f.name, f.default, f.metadata["help"]) for f in table] == [
        (f.name, options[f.name].default, options[f.name].help) for f in table]


@pytest.mark.slow  # a cold interpreter importing torch and loading the base twice: ~50 s in a fresh venv
def test_serves_the_sdk(tmp_path: Path) -> None:
    import tinker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TINKER_API_KEY": "tml-cli-key"}
    proc = subprocess.Popen([sys.executable, "-m", "toolrl", "tinker", "serve", "--port", str(port), "--state-dir",
                             str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        while line and "tinker API on" not in line:
            line = proc.stderr.readline()
        assert re.findall(r"http://\S+", line) == [f"http://127.0.0.1:{port}"]  # one URL: scripts grep for it
        rest = tinker.RestClient(base_url=f"http://127.0.0.1:{port}", api_key="tml-cli-key")
        names = [m.model_name for m in rest.get_server_capabilities().result().supported_models]
        assert names == ["tiny-qwen3"]
        assert (tmp_path / "state.sqlite").exists()
    finally:
        proc.terminate()
        proc.wait(30)
