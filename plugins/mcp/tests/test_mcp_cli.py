"""MCP tools through verl-layout tool configs: the Python API the CLI uses, and the CLI itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mcp_support import call, close_all, stdio_server, write_servers
from toolrl.tools.verl_config import build_tools, load_tools_file

TOOLS_YAML = """\
tools:
  - class_name: {class_name}
    config: {{type: mcp, timeout: 20}}
    mcp:
      mcp_servers_config_path: servers.json   # relative to this file
      tool_selected_list: [add, echo]
"""


def write_config(directory: Path, class_name: str = "mcp") -> Path:
    write_servers(directory, {"demo": stdio_server()})
    path = directory / "cfg.yaml"
    path.write_text(TOOLS_YAML.format(class_name=class_name))
    return path


def toolrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


async def test_tools_file_builds_mcp_tools(tmp_path: Path) -> None:
    for class_name in ("mcp", "verl.tools.mcp_base_tool.MCPBaseTool"):
        tools = await build_tools(load_tools_file(write_config(tmp_path, class_name)))
        try:
            assert sorted(tools) == ["add", "echo"]
            assert tools["add"].timeout == 20
            assert (await call(tools["add"], {"a": 2, "b": 3})).response.text == "5"
        finally:
            await close_all(tools)


def test_cli_tool_call_prints_the_result(tmp_path: Path) -> None:
    write_config(tmp_path)
    done = toolrl("tool", "call", "add", '{"a":2,"b":3}', "--tools-config", "cfg.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "5\n"


def test_cli_tool_list(tmp_path: Path) -> None:
    write_config(tmp_path)
    done = toolrl("tool", "list", "--tools-config", "cfg.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["add", "echo"]


def test_cli_reports_a_broken_server_as_a_usage_error(tmp_path: Path) -> None:
    write_servers(tmp_path, {"ghost": {"command": str(tmp_path / "missing-binary")}})
    (tmp_path / "cfg.yaml").write_text(TOOLS_YAML.format(class_name="mcp"))
    done = toolrl("tool", "call", "add", '{"a":2,"b":3}', "--tools-config", "cfg.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert "MCP server 'ghost': cannot list its tools" in done.stderr and "Traceback" not in done.stderr


def test_train_check_reads_the_servers_file_and_starts_no_server(tmp_path: Path) -> None:
    """`toolrl train --check` checks each MCP entry's block and servers file (MCPTool.check_entry) before
    anything loads; a server is started only when the tools are built, so a missing binary is not its to see."""
    root = Path(__file__).resolve().parents[3]
    (tmp_path / "cfg.yaml").write_text(TOOLS_YAML.format(class_name="mcp"))
    args = ("train", str(root / "examples" / "tiny.yaml"), f"tools.config_path={tmp_path / 'cfg.yaml'}",
            f"trainer.output_dir={tmp_path / 'run'}", "--check")
    done = toolrl(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and "cannot read MCP servers file" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    write_servers(tmp_path, {"ghost": {"command": str(tmp_path / "missing-binary")}})
    done = toolrl(*args, cwd=tmp_path)
    assert done.returncode == 0 and "check passed" in done.stdout, done.stderr
