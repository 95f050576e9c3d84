"""The ``code_interpreter`` tool: registry, config, both backends, the CLI, inline fences, rate limits."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from toolrl.parsers.tags import TagParser
from toolrl.plugins import get_plugins
from toolrl.tools import ToolConfigError
from toolrl.tools.verl_config import build_default_tool, build_tools, parse_tools_config
from toolrl_sandbox_fusion.models import CommandRunResult, CommandRunStatus, RunCodeResponse, RunStatus
from toolrl_sandbox_fusion.tool import CodeInterpreterTool, render


async def call(tool, arguments):
    iid = await tool.create()
    try:
        return await tool.call(iid, arguments)
    finally:
        await tool.release(iid)


@pytest.fixture
async def tool():
    t = await build_default_tool("code_interpreter")
    yield t
    await t.close()


def test_registered_with_verl_alias():
    registry = get_plugins().registry
    assert registry.load("tools", "code_interpreter") is CodeInterpreterTool
    assert registry.load("tools", "verl.tools.sandbox_fusion_tools.SandboxFusionTool") is CodeInterpreterTool


async def test_verl_tools_yaml_loads_unchanged(server):
    tools_file = parse_tools_config({"tools": [{
        "class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "config": {"type": "native", "sandbox_fusion_url": f"{server.url}/run_code", "num_workers": 4,
                   "enable_global_rate_limit": False, "rate_limit": 4, "default_timeout": 10,
                   "default_language": "python", "memory_limit_mb": 512},
        "tool_schema": {"type": "function", "function": {
            "name": "code_interpreter", "description": "A tool for executing code.",
            "parameters": {"type": "object", "properties": {
                "code": {"type": "string", "description": "The code to execute."}},
                "required": ["code"]}}},
    }]})
    tools = await build_tools(tools_file)
    try:
        result = await call(tools["code_interpreter"], {"code": "print(2**10)"})
    finally:
        await tools["code_interpreter"].close()
    assert result.status == "ok" and result.response.text == "1024"
    assert result.metrics["backend"] == "http"


def test_config_is_validated():
    with pytest.raises(ToolConfigError, match="config.sandbox_url"):
        CodeInterpreterTool({"sandbox_url": "http://x"})
    with pytest.raises(ToolConfigError, match="config.rate_limit"):
        CodeInterpreterTool({"rate_limit": 0})
    with pytest.raises(ToolConfigError, match="config.default_language"):
        CodeInterpreterTool({"default_language": "cobol"})
    with pytest.raises(ToolConfigError, match="embedded sandbox"):
        CodeInterpreterTool({"sandbox_fusion_url": "http://x", "sandbox_isolation": "unshare"})


async def test_embedded_call_and_metrics(tool):
    result = await call(tool, {"code": "print(1+1)"})
    assert (result.status, result.response.text, result.response.is_error) == ("ok", "2", False)
    m = result.metrics
    assert m["backend"] == "embedded" and m["status"] == "success" and m["sandbox_status"] == "Success"
    assert m["run_status"] == "Finished" and m["return_code"] == 0 and m["attempts"] == 1
    assert 0 <= m["queue_wait_s"] <= m["latency_s"] and m["execution_time_s"] > 0


async def test_http_backend_against_toolrl_sandbox_serve(server):
    tool = await build_default_tool("code_interpreter", {"sandbox_fusion_url": server.url})
    try:
        ok = await call(tool, {"code": "print(1+1)"})
        slow = await call(tool, {"code": "while True: pass", "timeout": 1})
    finally:
        await tool.close()
    assert ok.response.text == "2" and ok.metrics["backend"] == "http"
    assert slow.metrics["sandbox_status"] == "Failed" and slow.metrics["run_status"] == "TimeLimitExceeded"
    assert slow.response.text.startswith("Error: time limit exceeded")


async def test_while_true_times_out_as_failed_time_limit_exceeded(tool):
    result = await call(tool, {"code": "while True: pass", "timeout": 1})
    assert result.status == "error" and result.response.is_error
    assert result.metrics["sandbox_status"] == "Failed"
    assert result.metrics["run_status"] == "TimeLimitExceeded" and result.metrics["status"] == "timeout"
    assert "time limit exceeded" in result.response.text and "1 s" in result.response.text
    assert result.metrics["execution_time_s"] < 3


async def test_the_model_sees_stderr_exit_codes_and_memory_kills(tool):
    result = await call(tool, {"code": "import sys\nprint('out')\nprint('warn', file=sys.stderr)"})
    assert result.response.text == "stdout:\nout\nstderr:\nwarn" and result.status == "ok"
    result = await call(tool, {"code": "x = 1\nraise ValueError('bad value')"})
    assert result.response.text.startswith("Error: the code exited with code 1.\nstdout: (empty)\nstderr:\n")
    assert "ValueError: bad value" in result.response.text and result.metrics["status"] == "error"
    result = await call(tool, {"code": "x = bytearray(4 * 1024**3)"})
    assert result.response.text.startswith("Error: memory limit exceeded (1024 MB)")
    assert result.metrics["status"] == "memory"
    result = await call(tool, {"code": "pass"})
    assert result.response.text == "(no output)"


async def test_timeout_argument_is_capped_by_the_config():
    tool = CodeInterpreterTool({"default_timeout": 1})
    try:
        result = await call(tool, {"code": "import time; time.sleep(10)", "timeout": 600})
    finally:
        await tool.close()
    assert result.metrics["run_status"] == "TimeLimitExceeded" and result.metrics["execution_time_s"] < 3


async def test_languages(tool):
    result = await call(tool, {"code": "echo hi from bash", "language": "bash"})
    assert result.response.text == "hi from bash"
    result = await call(tool, {"code": "print(1)", "language": "cobol"})
    assert result.response.is_error and "unknown language 'cobol'" in result.response.text
    result = await call(tool, {"code": "__global__ void k(){}", "language": "cuda"})
    assert result.response.text.startswith("Sandbox error:") and "needs a GPU" in result.response.text


async def test_sandbox_unreachable_is_an_infrastructure_failure_not_the_models():
    tool = CodeInterpreterTool({"sandbox_fusion_url": "http://127.0.0.1:9"})  # discard port: refused
    tool._client.backoff_s = 0.001
    try:
        result = await call(tool, {"code": "print(1)"})
        wrong = await call(tool, {"code": "print(1)", "language": "cobol"})  # the model's mistake
    finally:
        await tool.close()
    # infra_error: the rollout loop ends the trajectory and training leaves it out (toolrl.data.batches).
    assert result.status == "infra_error" and "SandboxRequestError" in result.response.text
    assert "failed after 4 attempts: ConnectError" in result.response.text
    assert wrong.status == "error" and "unknown language" in wrong.response.text


async def test_signals_and_limits_are_named_for_the_model(tool):
    result = await call(tool, {"code": "import os\nos.kill(os.getpid(), 9)"})
    assert result.response.text.startswith("Error: the code was killed by signal 9 (SIGKILL).")
    assert result.metrics["return_code"] == -9 and result.metrics["status"] == "error"
    result = await call(tool, {"code": "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 2))\nwhile True: pass"})
    assert result.response.text.startswith(
        "Error: the code was killed by signal 24 (SIGXCPU).\n(CPU time limit exceeded)")


def test_render_clips_long_output_naming_what_was_cut():
    run = CommandRunResult(status=CommandRunStatus.Finished, return_code=0, stdout="a" * 20000 + "END", stderr="")
    text = render(RunCodeResponse(status=RunStatus.Success, run_result=run), 10, 1024)
    assert len(text) < 9000 and "characters omitted" in text and text.endswith("END")


async def test_in_flight_cap_and_queue_wait_metrics():
    tool = CodeInterpreterTool({"rate_limit": 2, "num_workers": 8})
    try:
        iid = await tool.create()
        results = await asyncio.gather(*(
            tool.call(iid, {"code": "import time; time.sleep(0.3)"}) for _ in range(6)))
        stats = tool.limiter.stats()
    finally:
        await tool.close()
    assert all(r.status == "ok" for r in results)
    assert stats["peak_in_flight"] == 2 and stats["in_flight"] == 0 and stats["admitted"] == 6
    waits = sorted(r.metrics["queue_wait_s"] for r in results)
    assert waits[-1] > 0.5  # the last pair waited for two earlier pairs


async def test_calls_per_second():
    tool = CodeInterpreterTool({"rate_limit": None, "calls_per_second": 5})
    try:
        iid = await tool.create()
        start = asyncio.get_running_loop().time()
        await asyncio.gather(*(tool.call(iid, {"code": "pass"}) for _ in range(6)))
        elapsed = asyncio.get_running_loop().time() - start
    finally:
        await tool.close()
    assert elapsed >= 1.0  # six starts at 5/s: the last one 1 s after the first


async def test_inline_python_fence_runs_through_the_tags_parser(tool):
    parser = TagParser(fences={"python": {"tool": "code_interpreter", "argument": "code"}})
    parsed = parser.parse("Let me compute.\n```python\nprint(sum(range(10)))\n```\n")
    assert [c.name for c in parsed.calls] == ["code_interpreter"]
    result = await call(tool, parsed.calls[0].arguments)
    assert parser.format_inline_result(result.response) == "\n```output\n45\n```\n"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=120)


def test_cli_tool_call_prints_2():
    proc = run_cli("tool", "call", "code_interpreter", '{"code":"print(1+1)"}')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"


def test_cli_tool_call_over_http(server):
    proc = run_cli("tool", "call", "code_interpreter", '{"code":"print(1+1)"}',
                   "--config", json.dumps({"sandbox_fusion_url": server.url}), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"] == "2" and out["metrics"]["backend"] == "http"


def test_cli_tool_call_time_limit():
    proc = run_cli("tool", "call", "code_interpreter", '{"code":"while True: pass","timeout":1}', "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["status"] == "error"
    assert out["metrics"]["sandbox_status"] == "Failed" and out["metrics"]["run_status"] == "TimeLimitExceeded"


async def test_global_rate_limit_without_ray_is_a_clear_error():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray from another test is connected")
    tool = CodeInterpreterTool({"enable_global_rate_limit": True})
    try:
        result = await call(tool, {"code": "print(1)"})
    finally:
        await tool.close()
    assert result.status == "error" and "ray.init" in result.response.text


def test_global_rate_limit_is_shared_by_tool_instances(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="toolrl-sandbox-test")
    try:
        async def scenario() -> dict:
            config = {"enable_global_rate_limit": True, "rate_limit": 2}
            tools = [CodeInterpreterTool(config) for _ in range(2)]
            try:
                iids = [await t.create() for t in tools]
                code = {"code": "import time; time.sleep(0.3)"}
                results = await asyncio.gather(*(t.call(i, code) for t, i in zip(tools, iids) for _ in range(3)))
                assert all(r.status == "ok" for r in results), [r.response.text for r in results]
                return tools[0].limiter.stats()
            finally:
                for t in tools:
                    await t.close()

        stats = asyncio.run(scenario())
        # One actor for both instances: six calls admitted, never more than two at once.
        assert stats["admitted"] == 6 and stats["peak_in_flight"] == 2
    finally:
        ray.shutdown()
