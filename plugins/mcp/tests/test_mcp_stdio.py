"""MCP tools over stdio against a real MCPServer child process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mcp_support import alive, build, call, child_servers, close_all, stdio_server, wait_until, write_servers
from toolrl.tools import ToolConfigError
from toolrl_mcp.client import POOL, ServerUnavailable
from toolrl_mcp.config import ServerSpec
from toolrl_mcp.tool import MCPTool


async def server_pid(tools: dict) -> int:
    result = await call(tools["pid"], {})
    assert result.status == "ok", result.response.text
    return int(result.response.text)


async def test_lists_tools_with_their_input_schemas(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server()})
    try:
        assert sorted(tools) == ["add", "authorization", "echo", "fail", "pid", "pixel", "sleep", "stats"]
        function = tools["add"].tool_schema.function
        assert function.description == "Add two integers."
        assert function.parameters["required"] == ["a", "b"]
        assert function.parameters["properties"]["a"]["type"] == "integer"
    finally:
        await close_all(tools)


async def test_results_text_structured_error_image(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server()})
    try:
        added = await call(tools["add"], {"a": 2, "b": 3})
        assert (added.status, added.response.text) == ("ok", "5")
        assert added.metrics["structured_content"] == {"result": 5}

        stats = await call(tools["stats"], {"values": [1, 2, 6]})
        assert stats.metrics["structured_content"] == {"min": 1.0, "max": 6.0, "mean": 3.0}

        failed = await call(tools["fail"], {"message": "boom"})
        assert failed.status == "error" and failed.response.is_error
        assert "boom" in failed.response.text

        pixel = await call(tools["pixel"], {})
        assert pixel.response.text == "one red pixel"
        assert len(pixel.response.images) == 1 and pixel.response.images[0].startswith("data:image/png;base64,")

        invalid = await call(tools["add"], {"a": "two"})
        assert invalid.status == "invalid_arguments" and "'b'" in invalid.response.text
    finally:
        await close_all(tools)


async def test_all_tools_share_one_session_and_calls_run_concurrently(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server(max_concurrency=64)})
    try:
        connection = POOL.get("demo", tools["sleep"].spec)
        pids = {await server_pid(tools)}
        start = time.perf_counter()
        results = await asyncio.gather(*(call(tools["sleep"], {"seconds": 0.5}) for _ in range(48)),
                                       *(call(tools["add"], {"a": i, "b": 1}) for i in range(48)))
        elapsed = time.perf_counter() - start
        assert [r.status for r in results] == ["ok"] * 96
        assert [r.response.text for r in results[48:]] == [str(i + 1) for i in range(48)]
        assert elapsed < 3.0, f"48 concurrent 0.5 s calls took {elapsed:.2f} s: they were serialised"
        pids.add(await server_pid(tools))
        assert len(pids) == 1 and connection.sessions_opened == 1
    finally:
        await close_all(tools)


async def test_concurrency_cap_limits_calls_in_flight(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server(max_concurrency=2)})
    try:
        start = time.perf_counter()
        results = await asyncio.gather(*(call(tools["sleep"], {"seconds": 0.3}) for _ in range(6)))
        elapsed = time.perf_counter() - start
        assert all(r.status == "ok" for r in results)
        assert elapsed >= 0.85, f"6 calls of 0.3 s with a cap of 2 finished in {elapsed:.2f} s"
    finally:
        await close_all(tools)


async def test_hanging_tool_times_out_and_the_session_stays_usable(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server(timeout=0.5)})
    try:
        pid = await server_pid(tools)
        start = time.perf_counter()
        hung = await call(tools["sleep"], {"seconds": 60})
        assert hung.status == "timeout" and hung.response.is_error
        assert time.perf_counter() - start < 3
        assert (await call(tools["add"], {"a": 1, "b": 2})).response.text == "3"
        assert await server_pid(tools) == pid
    finally:
        await close_all(tools)


async def test_config_timeout_applies_to_every_tool(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server()}, config={"type": "mcp", "timeout": 0.4})
    try:
        assert {t.timeout for t in tools.values()} == {0.4}
        assert (await call(tools["sleep"], {"seconds": 30})).status == "timeout"
    finally:
        await close_all(tools)


async def test_killed_server_gives_errors_then_is_restarted(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server()})
    try:
        pid = await server_pid(tools)
        in_flight = asyncio.ensure_future(call(tools["sleep"], {"seconds": 20}))
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        start = time.perf_counter()
        lost = await in_flight
        assert lost.status == "infra_error" and "connection lost" in lost.response.text
        assert time.perf_counter() - start < 2, "the in-flight call waited for its timeout"

        statuses = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            result = await call(tools["add"], {"a": 20, "b": 22})
            statuses.append(result.status)
            if result.status == "ok":
                assert result.response.text == "42"
                break
            await asyncio.sleep(0.2)
        assert statuses[-1] == "ok", statuses
        new_pid = await server_pid(tools)
        assert new_pid != pid and POOL.get("demo", tools["add"].spec).sessions_opened == 2
    finally:
        await close_all(tools)


async def test_reconnects_back_off_exponentially(tmp_path: Path) -> None:
    spec = ServerSpec.model_validate({"command": str(tmp_path / "no-such-binary"), "backoff_initial": 0.2})
    connection = POOL.get("ghost", spec)
    try:
        attempts, fast_failures = [], 0
        start = time.monotonic()
        while len(attempts) < 4:
            try:
                await connection.list_tools()
            except ServerUnavailable as exc:
                if "next reconnect attempt" in str(exc):
                    fast_failures += 1
                else:
                    assert "cannot connect" in str(exc) and "no-such-binary" in str(exc)
                    attempts.append(time.monotonic() - start)
            await asyncio.sleep(0.02)
        gaps = [b - a for a, b in zip(attempts, attempts[1:])]
        # The first retry goes at once, then backoff_initial * 2**k.
        assert gaps[0] < 0.15 and 0.2 <= gaps[1] < 0.35 and 0.4 <= gaps[2] < 0.6, gaps
        assert fast_failures > 10
    finally:
        await connection.aclose()


async def test_unstartable_server_fails_the_build_with_its_name(tmp_path: Path) -> None:
    servers = {"ghost": {"command": str(tmp_path / "no-such-binary")}}
    start = time.perf_counter()
    with pytest.raises(ToolConfigError, match="MCP server 'ghost': cannot list its tools"):
        await build(tmp_path, servers)
    assert time.perf_counter() - start < 5


async def test_server_that_never_answers_fails_within_connect_timeout(tmp_path: Path) -> None:
    silent = {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"], "connect_timeout": 1}
    start = time.perf_counter()
    with pytest.raises(ToolConfigError, match="'silent'"):
        await build(tmp_path, {"silent": silent})
    assert time.perf_counter() - start < 6


async def test_collision_between_real_servers_and_prefix_fix(tmp_path: Path) -> None:
    before = child_servers()
    with pytest.raises(ToolConfigError, match="'add' is provided by servers 'one' and 'two'"):
        await build(tmp_path, {"one": stdio_server(), "two": stdio_server("--name", "two")})
    assert child_servers() == before, "a failed build left server children running"
    tools = await build(tmp_path, {"one": stdio_server(tools=["add"]),
                                   "two": stdio_server("--name", "two", prefix="two_", tools=["add"])})
    try:
        assert sorted(tools) == ["add", "two_add"]
        assert (await call(tools["two_add"], {"a": 1, "b": 1})).response.text == "2"
    finally:
        await close_all(tools)


async def test_selection_keeps_unselected_servers_closed(tmp_path: Path) -> None:
    before = child_servers()
    tools = await build(tmp_path, {"demo": stdio_server(rename={"add": "plus"}),
                                   "idle": stdio_server(prefix="idle_")},
                        tool_selected_list=["plus", "pid"])
    try:
        assert sorted(tools) == ["pid", "plus"]
        assert all(t.server == "demo" for t in tools.values())
        assert (await call(tools["plus"], {"a": 2, "b": 2})).response.text == "4"
        assert child_servers() - before == {await server_pid(tools)}, "the unselected server still runs"
    finally:
        await close_all(tools)
    assert child_servers() == before


async def test_misplaced_config_keys_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match="config.max_concurrency: unknown key"):
        await build(tmp_path, {"demo": stdio_server(tools=["add"])}, config={"type": "mcp", "max_concurrency": 3})


async def test_env_and_cwd_reach_the_server(tmp_path: Path) -> None:
    script = tmp_path / "env_server.py"
    script.write_text(textwrap.dedent("""
        import os
        from mcp.server.mcpserver import MCPServer
        server = MCPServer("env")
        @server.tool()
        def where() -> str:
            return os.environ["GREETING"] + " from " + os.getcwd()
        server.run()
    """))
    workdir = tmp_path / "work"
    workdir.mkdir()
    servers = {"env": {"command": sys.executable, "args": [str(script)], "env": {"GREETING": "hello"},
                       "cwd": str(workdir)}}
    tools = await build(tmp_path, servers)
    try:
        assert (await call(tools["where"], {})).response.text == f"hello from {workdir}"
    finally:
        await close_all(tools)


async def test_close_stops_the_child_and_later_calls_error(tmp_path: Path) -> None:
    tools = await build(tmp_path, {"demo": stdio_server()})
    pid = await server_pid(tools)
    assert alive(pid)
    await close_all(tools)
    assert not alive(pid), "close() returned with the server child still running"
    assert "closed" in (await call(tools["add"], {"a": 1, "b": 1})).response.text


def _run_script(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    path = write_servers(tmp_path, {"demo": stdio_server()})
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, sys
        from toolrl_mcp.tool import MCPTool

        async def main():
            section = {{"mcp": {{"mcp_servers_config_path": {str(path)!r}, "tool_selected_list": ["pid"]}}}}
            (tool,) = await MCPTool.from_config({{"type": "mcp"}}, None, section)
            instance = await tool.create()
            print((await tool.call(instance, {{}})).response.text, flush=True)
        {textwrap.indent(textwrap.dedent(body), '        ').strip()}
    """))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)


def test_children_exit_when_the_client_process_ends_without_close(tmp_path: Path) -> None:
    process = _run_script(tmp_path, "asyncio.run(main())")
    pid = int(process.stdout.readline())
    assert process.wait(30) == 0
    assert wait_until(lambda: not alive(pid), 10), "server child outlived its client"


def test_children_exit_when_the_client_process_is_killed(tmp_path: Path) -> None:
    process = _run_script(tmp_path, """
        async def forever():
            await main()
            await asyncio.sleep(3600)
        asyncio.run(forever())
    """)
    pid = int(process.stdout.readline())
    process.kill()
    process.wait(10)
    assert wait_until(lambda: not alive(pid), 10), "server child outlived its killed client"


def test_tools_built_on_one_loop_work_on_another(tmp_path: Path) -> None:
    """The CLI pattern: build in one asyncio.run, call in the next."""
    path = write_servers(tmp_path, {"demo": stdio_server()})
    section = {"mcp": {"mcp_servers_config_path": str(path), "tool_selected_list": ["add"]}}
    (tool,) = asyncio.run(MCPTool.from_config({"type": "mcp"}, None, section))

    async def use() -> str:
        try:
            return (await call(tool, {"a": 40, "b": 2})).response.text
        finally:
            await tool.close()

    assert asyncio.run(use()) == "42"
