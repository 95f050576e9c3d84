"""Build real (unpacked) distributions with ``toolrl`` entry points in a directory, so plugin
discovery runs through importlib.metadata exactly as for pip-installed plugins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def make_dist(root: Path, dist: str, entry: str, module: str, code: str, version: str = "0.1.0") -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[toolrl]\n{entry} = {module}\n")


def run_toolrl(*args: str, path: Path | None = None, env: dict[str, str] | None = None,
               stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(path), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True,
                          env=full_env, input=stdin, timeout=timeout)


GOOD_PLUGIN = """
from toolrl import hookimpl

@hookimpl
def register_tools(register):
    register("good_tool_impl:EchoTool", name="echo")
"""

GOOD_TOOL_IMPL = """
from toolrl.tools import Tool

class EchoTool(Tool):
    schema = {"type": "function", "function": {"name": "echo", "description": "Echo text back.",
              "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"], "additionalProperties": False}}}

    async def execute(self, instance_id, arguments, **kw):
        return arguments["text"], 0.0, {}
"""


# A reward plugin for training tests: it differs between trajectories, so GRPO has a gradient even for a
# random model.
EVEN_TOKENS = """
from toolrl import hookimpl


class EvenTokens:
    # The share of even token ids in the response: differs between trajectories, so GRPO has a
    # gradient even for a random model.
    def __call__(self, response, ground_truth, **info):
        ids = info["response_ids"]
        return sum(t % 2 == 0 for t in ids) / max(len(ids), 1)


@hookimpl
def register_reward_functions(register):
    register(EvenTokens, name="even_tokens")
"""
