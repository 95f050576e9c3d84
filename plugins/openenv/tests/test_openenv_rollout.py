"""`toolrl rollout` with `env: openenv`: the model (scripted) calls the ledger server's tools over the
wire, the episode's done ends each trajectory, and the server's reward reaches the traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_cli_rollout_reward_reaches_the_trace(ledger, tmp_path: Path) -> None:
    script = [call("deposit", {"amount": 4}), call("deposit", {"amount": 6}), call("balance", {}), "Done: 10."]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model": {"source": "tiny-qwen3"},
        "env": "openenv", "env_options": {"base_url": ledger.base_url, "size": 2, "prompt": "Reach a balance of 10."},
        "data": {"batch_size": 2},
        "engine": {"name": "scripted", "options": {"script": script}},
        "rollout": {"n": 2, "max_turns": 5},
        "trainer": {"total_steps": 1, "output_dir": str(tmp_path / "out"), "progress": False},
    }))
    done = subprocess.run([sys.executable, "-m", "toolrl", "rollout", str(tmp_path / "config.yaml")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    traces = [json.loads(line) for line in (tmp_path / "out/rollouts/step_00001.jsonl").read_text().splitlines()]
    assert len(traces) == 4
    for t in traces:
        assert [r["response"]["text"] for r in t["tool_results"]] == ["4", "10"]  # done: balance never ran
        assert t["tool_results"][1]["metrics"] == {"done": True, "reward": 1.0}
        assert t["termination"] == "done" and t["tool_rewards"] == {}
        assert t["reward_terms"]["openenv"] == 1.0 and t["reward"] == 1.0
