"""`toolrl rollout` with an MCP tool in the config: the model (scripted) calls `add` on a real stdio
MCP server and the traces show the server's answer, masked out of the loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from mcp_support import SERVERS

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_rollout_with_an_mcp_tool(tmp_path: Path) -> None:
    (tmp_path / "servers.json").write_text(json.dumps({"mcpServers": {"demo": {
        "command": sys.executable, "args": [str(SERVERS / "demo_server.py")]}}}))
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [{
        "class_name": "mcp", "config": {"type": "mcp"},
        "mcp": {"mcp_servers_config_path": "servers.json", "tool_selected_list": ["add"]}}]}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model": {"source": "tiny-qwen3"},
        "env": "arithmetic", "env_options": {"train_size": 4}, "data": {"batch_size": 1},
        "engine": {"name": "scripted", "options": {"script": [CALL, "The answer is 5."]}},
        "rollout": {"n": 2, "max_turns": 3},
        "tools": {"config_path": "tools.yaml"},
        "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "out"), "progress": False},
    }))
    done = subprocess.run([sys.executable, "-m", "toolrl", "rollout", str(tmp_path / "config.yaml")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    traces = [json.loads(line) for line in (tmp_path / "out/rollouts/step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for t in traces:
        assert t["termination"] == "answered" and t["turns"] == 2
        [result] = t["tool_results"]
        assert result["name"] == "add" and result["status"] == "ok" and result["response"]["text"] == "5"
        assert "<tool_response>\n5\n</tool_response>" in t["response_text"]
    metrics = json.loads((tmp_path / "out/metrics.jsonl").read_text())
    assert metrics["tool_call_count"] == 2 and metrics["tool_success_count"] == 2 and "add" in metrics["tool_latency_s"]
