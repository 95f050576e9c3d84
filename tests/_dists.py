"""Build real (unpacked) distributions with ``toolrl`` entry points in a directory, so plugin
discovery runs through importlib.metadata exactly as for pip-installed plugins; or a wheel of a package
directory, for pip to install into a throwaway venv."""

from __future__ import annotations

import base64
import hashlib
import os
import site
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def make_dist(root: Path, dist: str, entry: str, module: str, code: str, version: str = "0.1.0") -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[toolrl]\n{entry} = {module}\n")


def load_plugin(tmp_path: Path, monkeypatch, reload, dist: str, entry: str, module: str, code: str) -> None:
    """:func:`make_dist` in ``tmp_path/plugin``, put on ``sys.path`` and loaded in this process (``reload``:
    the ``toolrl_reload_plugins`` fixture's)."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    make_dist(plugin, dist, entry, module, code)
    monkeypatch.syspath_prepend(str(plugin))
    reload()


def make_wheel(package: Path, out: Path, dist: str, entry_points: Mapping[str, str], version: str = "0.1.0",
               requires: Sequence[str] = ("toolrl",)) -> Path:
    """A pure-Python wheel of the import package in directory ``package`` (every file in it, templates
    included), with ``toolrl`` entry points: built here, so installing it needs no build backend."""
    name = dist.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    files = {f"{package.name}/{f.relative_to(package).as_posix()}": f.read_bytes()
             for f in sorted(package.rglob("*")) if f.is_file() and "__pycache__" not in f.parts}
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n"
                                                                                  for r in requires)
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: toolrl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = "".join(["[toolrl]\n"] + [f"{k} = {v}\n" for k, v in entry_points.items()]).encode()
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()]
    files[f"{info}/RECORD"] = "".join(line + "\n" for line in [*record, f"{info}/RECORD,,"]).encode()
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def venv_over_this_one(root: Path) -> Path:
    """A venv at ``root`` that also sees this interpreter's packages (a .pth adds its site directories,
    their own .pth files included), so what is installed into it downloads and compiles nothing.
    Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    parents = site.getsitepackages()
    (Path(purelib) / "_over_parent.pth").write_text(f"import site; list(map(site.addsitedir, {parents!r}))\n")
    return python


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
