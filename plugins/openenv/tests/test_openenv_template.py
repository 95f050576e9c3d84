"""The openenv package's own template environment (`openenv init`), started by the plugin from its
directory (app from its openenv.yaml), driven over the wire by toolrl's loop, and stopped when the
routes close."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
from support import close, rollout, routes


async def test_template_environment_started_by_the_plugin(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    env_dir = tmp_path / "echo_env"
    assert (env_dir / "openenv.yaml").exists()
    # The template allows one session at a time (max_concurrent_envs=1): max_sessions queues the rest.
    options = {"app_dir": "echo_env", "max_sessions": 1}
    built = await routes(options, base_dir=tmp_path)
    [kind] = [p for p in built[1] if hasattr(p, "shared")]
    base_url, _ = await kind.shared.get("server", None)
    try:
        step = '<tool_call>\n{"name": "step", "arguments": {"message": "%s"}}\n</tool_call>'
        scripts = {"s0-": [step % "hello", "Done."], "s1-": [step % "ab", "Done."], "s2-": [step % "abcd", "Done."]}
        hello, two, four = await rollout(options, [{}, {}, {}], scripts, built=built)
        # not an MCP environment: its action is the one tool, with the action model's schema
        assert hello.tool_results[0].status == "ok", hello.tool_results[0]
        assert json.loads(hello.tool_results[0].response.text)["echoed_message"] == "hello"
        assert hello.tool_results[0].metrics == {"reward": 0.5}
        # the template's reward: 0.1 per character, at most 1
        assert [t.reward_terms["openenv"] for t in (hello, two, four)] == [0.5, 0.2, 0.4]
    finally:
        await close(built[1])
    try:
        httpx.get(f"{base_url}/health", timeout=2)
        raise AssertionError("the server still answers after its routes closed")
    except httpx.HTTPError:
        pass
