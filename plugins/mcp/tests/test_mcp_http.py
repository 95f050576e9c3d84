"""MCP tools over streamable HTTP and SSE against a real MCPServer run by uvicorn in a subprocess."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from mcp_support import HTTPServer, build, call, close_all
from toolrl.tools import ToolConfigError
from toolrl_mcp.client import POOL


async def test_streamable_http_calls_and_headers(tmp_path: Path, http_server: HTTPServer) -> None:
    servers = {"remote": {"url": http_server.url, "headers": {"Authorization": "Token abc"}}}
    tools = await build(tmp_path, servers)
    try:
        assert (await call(tools["add"], {"a": 2, "b": 3})).response.text == "5"
        assert (await call(tools["authorization"], {})).response.text == "Token abc"
        pixel = await call(tools["pixel"], {})
        assert pixel.response.images and pixel.response.text == "one red pixel"
        assert (await call(tools["fail"], {"message": "nope"})).response.is_error
    finally:
        await close_all(tools)


async def test_sse_with_bearer_token(tmp_path: Path, sse_server: HTTPServer) -> None:
    tools = await build(tmp_path, {"legacy": {"url": sse_server.url, "auth_token": "s3cret"}})
    try:
        assert tools["add"].spec.transport == "sse"
        assert (await call(tools["add"], {"a": 20, "b": 22})).response.text == "42"
        assert (await call(tools["authorization"], {})).response.text == "Bearer s3cret"
    finally:
        await close_all(tools)


async def test_http_hanging_tool_times_out_and_session_survives(tmp_path: Path, http_server: HTTPServer) -> None:
    tools = await build(tmp_path, {"remote": {"url": http_server.url, "timeout": 0.5}})
    try:
        start = time.perf_counter()
        assert (await call(tools["sleep"], {"seconds": 60})).status == "timeout"
        assert time.perf_counter() - start < 3
        assert (await call(tools["echo"], {"text": "still here"})).response.text == "still here"
        assert POOL.get("remote", tools["echo"].spec).sessions_opened == 1
    finally:
        await close_all(tools)


async def test_http_many_concurrent_calls_over_one_session(tmp_path: Path, http_server: HTTPServer) -> None:
    tools = await build(tmp_path, {"remote": {"url": http_server.url, "max_concurrency": 32}})
    try:
        start = time.perf_counter()
        results = await asyncio.gather(*(call(tools["sleep"], {"seconds": 0.5}) for _ in range(32)))
        assert all(r.status == "ok" for r in results)
        assert time.perf_counter() - start < 3
        assert POOL.get("remote", tools["sleep"].spec).sessions_opened == 1
    finally:
        await close_all(tools)


async def test_http_server_killed_then_back(tmp_path: Path, http_server: HTTPServer) -> None:
    tools = await build(tmp_path, {"remote": {"url": http_server.url, "backoff_initial": 0.2}})
    try:
        assert (await call(tools["add"], {"a": 1, "b": 1})).response.text == "2"
        in_flight = asyncio.ensure_future(call(tools["sleep"], {"seconds": 20}))
        await asyncio.sleep(0.3)
        http_server.kill()
        start = time.perf_counter()
        lost = await in_flight
        assert lost.status == "infra_error" and time.perf_counter() - start < 3

        down = [await call(tools["add"], {"a": 1, "b": 1}) for _ in range(3)]
        assert all(r.status == "infra_error" for r in down), [r.response.text for r in down]
        assert any("unavailable" in r.response.text or "cannot connect" in r.response.text for r in down)

        http_server.start()
        deadline = time.monotonic() + 30
        result = down[-1]
        while time.monotonic() < deadline and result.status != "ok":
            await asyncio.sleep(0.2)
            result = await call(tools["add"], {"a": 40, "b": 2})
        assert result.status == "ok" and result.response.text == "42"
    finally:
        await close_all(tools)


async def test_unreachable_url_fails_the_build_quickly(tmp_path: Path) -> None:
    unreachable = HTTPServer("http")  # a free port nobody listens on
    start = time.perf_counter()
    with pytest.raises(ToolConfigError, match="MCP server 'remote': cannot list its tools.*ConnectError"):
        await build(tmp_path, {"remote": {"url": unreachable.url}})
    assert time.perf_counter() - start < 5
