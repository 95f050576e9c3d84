"""``toolrl sandbox serve`` as a SandboxFusion server, and the HTTP client (retries) against real servers."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sandbox_support import start_server, stop_server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from toolrl_sandbox_fusion.client import SandboxFusionClient, SandboxRequestError, run_code_url
from toolrl_sandbox_fusion.models import CommandRunStatus, RunCodeRequest, RunStatus


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/run_code", json=body, timeout=30)


def test_ping(server):
    response = httpx.get(f"{server.url}/v1/ping", timeout=10)
    assert response.status_code == 200 and response.json() == "pong"


def test_run_code_response_fields(server):
    response = post(server, {"code": "print(1+1)", "language": "python"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert body["status"] == "Success" and body["compile_result"] is None
    assert set(body["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert body["run_result"]["status"] == "Finished" and body["run_result"]["stdout"] == "2\n"


def test_time_limit(server):
    body = post(server, {"code": "while True: pass", "language": "python", "run_timeout": 1}).json()
    assert body["status"] == "Failed" and body["run_result"]["status"] == "TimeLimitExceeded"
    assert body["run_result"]["return_code"] is None


def test_memory_limit_is_honoured(server):
    code = "x = bytearray(300 * 1024 * 1024); print('ok')"
    assert post(server, {"code": code, "language": "python", "memory_limit_MB": 100}).json()["status"] == "Failed"
    assert post(server, {"code": code, "language": "python", "memory_limit_MB": 1000}).json()["status"] == "Success"



def test_stdin_and_files_round_trip(server):
    body = post(server, {
        "code": "import sys\nopen('out.txt','w').write(open('in.txt').read() + sys.stdin.read())",
        "language": "python", "stdin": "+stdin", "files": {"in.txt": base64.b64encode(b"file").decode()},
        "fetch_files": ["out.txt"],
    }).json()
    assert body["status"] == "Success"
    assert base64.b64decode(body["files"]["out.txt"]) == b"file+stdin"


def test_validation_errors_are_fastapi_shaped(server):
    response = post(server, {"code": "print(1)", "language": "cobol"})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["type"] == "literal_error" and detail[0]["loc"] == ["body", "language"]
    response = post(server, {"language": "python"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "code"]
    response = httpx.post(f"{server.url}/run_code", content=b"{not json", timeout=10)
    assert response.status_code == 422


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback drops to uid 65534 only when started as root")
def test_unshare_server_hides_the_host_filesystem():
    """``toolrl sandbox serve --isolation unshare``: world-readable host files are not there."""
    folder = Path(f"/var/tmp/toolrl-test-{uuid.uuid4().hex}")
    folder.mkdir(mode=0o755)
    public = folder / "public.txt"
    public.write_text("public-marker")
    public.chmod(0o644)
    checkout = Path(__file__).resolve().parents[3] / "pyproject.toml"  # the project's checkout
    code = (f"import os\nfor path in ({str(public)!r}, {str(checkout)!r}, {str(checkout.parent)!r}):\n"
            "    print(path, os.path.exists(path))\nprint(os.listdir('/var/tmp'))\n"
            "print(open(" + repr(str(public)) + ").read())")
    srv = start_server("--isolation", "unshare", "--pool-size", "1")
    try:
        body = post(srv, {"code": code, "language": "python"}).json()
    finally:
        stop_server(srv)
        public.unlink()
        folder.rmdir()
    assert checkout.stat().st_mode & 0o004
    lines = body["run_result"]["stdout"].splitlines()
    # /var/tmp is the sandbox's own, empty folder (as the other usual top-level folders)
    assert lines == [f"{public} False", f"{checkout} False", f"{checkout.parent} False", "[]"]
    assert body["status"] == "Failed" and "No such file or directory" in body["run_result"]["stderr"]


def test_unsupported_language_is_a_sandbox_error(server):
    body = post(server, {"code": "__global__ void k(){}", "language": "cuda"}).json()
    assert body["status"] == "SandboxError" and "not supported" in body["message"]


async def test_client_against_the_server(server):
    client = SandboxFusionClient(server.url)
    try:
        response, attempts = await client.run_code(RunCodeRequest(code="print(6*7)", language="python"))
        assert attempts == 1 and response.status == RunStatus.Success and response.run_result.stdout == "42\n"
        results = await asyncio.gather(*(
            client.run_code(RunCodeRequest(code=f"print({i})", language="python")) for i in range(8)))
        assert [r.run_result.stdout for r, _ in results] == [f"{i}\n" for i in range(8)]
        response, _ = await client.run_code(
            RunCodeRequest(code="import time; time.sleep(5)", language="python", run_timeout=0.5))
        assert response.run_result.status == CommandRunStatus.TimeLimitExceeded
    finally:
        await client.aclose()


def test_url_forms():
    assert run_code_url("http://h:8080") == "http://h:8080/run_code"
    assert run_code_url("http://h:8080/") == "http://h:8080/run_code"
    assert run_code_url("https://faas.example/run_code") == "https://faas.example/run_code"


# -- retries, against a real (misbehaving) HTTP server on loopback -------------------------------------


class Flaky:
    """An ASGI server answering ``failures`` times with ``status`` before a valid response."""

    def __init__(self, status: int, failures: int, retry_after: str | None = None) -> None:
        self.status, self.failures, self.retry_after = status, failures, retry_after
        self.calls: list[dict] = []

        async def run_code(request: Request):
            self.calls.append(await request.json())
            if len(self.calls) <= self.failures:
                headers = {"Retry-After": self.retry_after} if self.retry_after else None
                return PlainTextResponse("busy", status_code=self.status, headers=headers)
            return JSONResponse({"status": "Success", "message": "", "run_result": {
                "status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": "ok\n", "stderr": ""}})

        self.app = Starlette(routes=[Route("/run_code", run_code, methods=["POST"])])


async def test_retries_on_503_then_succeeds_and_sends_memory_limit(serve_app):
    flaky = Flaky(503, failures=2)
    client = SandboxFusionClient(serve_app(flaky.app), backoff_s=0.01)
    try:
        response, attempts = await client.run_code(
            RunCodeRequest(code="print(1)", language="python", memory_limit_MB=256))
    finally:
        await client.aclose()
    assert attempts == 3 and response.run_result.stdout == "ok\n"
    assert len(flaky.calls) == 3 and all(c["memory_limit_MB"] == 256 for c in flaky.calls)


async def test_retry_after_is_honoured(serve_app):
    flaky = Flaky(429, failures=1, retry_after="0.3")
    client = SandboxFusionClient(serve_app(flaky.app), backoff_s=0.0)
    start = time.monotonic()
    try:
        _, attempts = await client.run_code(RunCodeRequest(code="print(1)", language="python"))
    finally:
        await client.aclose()
    assert attempts == 2 and time.monotonic() - start >= 0.3


async def test_non_retryable_status_fails_at_once(serve_app):
    flaky = Flaky(500, failures=10)
    client = SandboxFusionClient(serve_app(flaky.app), backoff_s=0.01)
    try:
        with pytest.raises(SandboxRequestError, match="HTTP 500") as info:
            await client.run_code(RunCodeRequest(code="print(1)", language="python"))
    finally:
        await client.aclose()
    assert info.value.attempts == 1 and len(flaky.calls) == 1


async def test_gives_up_after_max_attempts(serve_app):
    flaky = Flaky(502, failures=10)
    client = SandboxFusionClient(serve_app(flaky.app), max_attempts=3, backoff_s=0.01)
    try:
        with pytest.raises(SandboxRequestError, match="after 3 attempts: HTTP 502"):
            await client.run_code(RunCodeRequest(code="print(1)", language="python"))
    finally:
        await client.aclose()
    assert len(flaky.calls) == 3


async def test_connection_refused_is_retried_then_reported():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    client = SandboxFusionClient(f"http://127.0.0.1:{port}", max_attempts=2, backoff_s=0.01)
    try:
        with pytest.raises(SandboxRequestError, match="after 2 attempts: ConnectError") as info:
            await client.run_code(RunCodeRequest(code="print(1)", language="python"))
    finally:
        await client.aclose()
    assert info.value.attempts == 2


async def test_read_timeout_is_not_retried(serve_app):
    calls = []

    async def slow(request: Request):
        calls.append(1)
        await asyncio.sleep(3)
        return JSONResponse({})

    holder = Flaky(200, 0)
    holder.app = Starlette(routes=[Route("/run_code", slow, methods=["POST"])])
    client = SandboxFusionClient(serve_app(holder.app), timeout_slack_s=0.0)
    try:
        with pytest.raises(SandboxRequestError, match="ReadTimeout"):
            await client.run_code(RunCodeRequest(code="print(1)", language="python", run_timeout=0.1,
                                                 compile_timeout=0.1))
    finally:
        await client.aclose()
    assert len(calls) == 1
