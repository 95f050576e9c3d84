"""What the fleet's tests share: the docs' ``counter`` session as an installed distribution, ``toolrl``
run as a user runs it, and a config's one-line error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner, Result
from toolrl.cli import cli

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"


def counter_session() -> str:
    """The ``Counter`` session kind of docs/plugins.md (its one Python block that defines it)."""
    blocks = re.findall(r"^```python\n(.*?)^```$", (DOCS / "plugins.md").read_text(), re.S | re.M)
    [block] = [b for b in blocks if "class Counter(EnvironmentSession)" in b]
    return block


def install(root: Path, name: str, code: str) -> None:
    """A distribution ``toolrl-plugin-NAME`` (entry point NAME, module toolrl_NAME holding ``code``) in ``root``."""
    (root / f"toolrl_{name}.py").write_text(code)
    info = root / f"toolrl_plugin_{name}-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: toolrl-plugin-{name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[toolrl]\n{name} = toolrl_{name}\n")


def run_toolrl(*args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m toolrl ARGS`` in a process of its own (``path``: in front of its imports)."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def train_error(tmp_path: Path, *args: str, **sections: object) -> str:
    """``toolrl train CONFIG ARGS`` of a tiny run with ``sections``: its one error line (exit 2), nothing written."""
    config = {"model": {"source": "tiny-qwen3"}, "env": "arithmetic", "env_options": {"train_size": 4},
              "tools": {"entries": [{"class_name": "calculator"}]},
              "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "run"), "progress": False, "plot": False},
              **sections}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result: Result = CliRunner().invoke(cli, ["train", str(path), *args])
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), result.stderr
    assert not (tmp_path / "run").exists()
    return lines[0]
