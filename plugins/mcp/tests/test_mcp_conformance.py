"""The toolrl conformance kit on an MCP tool (``add`` of the demo server over stdio)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from mcp_support import stdio_server, write_servers
from toolrl.testing import ToolConformance

# The servers file must name this interpreter, so the config is written at import time.
_CONFIG_DIR = Path(tempfile.mkdtemp(prefix="toolrl-mcp-conformance-"))
atexit.register(shutil.rmtree, _CONFIG_DIR, True)
write_servers(_CONFIG_DIR, {"demo": stdio_server(max_concurrency=32)})
(_CONFIG_DIR / "tools.yaml").write_text(
    "tools:\n  - class_name: mcp\n    config: {type: mcp}\n"
    "    mcp: {mcp_servers_config_path: servers.json, tool_selected_list: [add]}\n"
)


class TestMCPToolConformance(ToolConformance):
    tool_name = "add"
    tools_config_file = _CONFIG_DIR / "tools.yaml"
    valid_arguments = {"a": 2, "b": 3}
    invalid_arguments = [{"a": "two", "b": 3}, {"a": 1}]
    expected_text = "5"
