"""SandboxFusion parity: what its server answers (sandbox/server/sandbox_api.py, runners/base.py) and its
own API tests (sandbox/tests/runners/test_python.py), checked on the embedded sandbox and over HTTP."""

from __future__ import annotations

import base64
import os
import subprocess

import httpx
import pydantic
import pytest
from sandbox_support import HAVE_BWRAP, IS_ROOT
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.models import CommandRunStatus, RunCodeRequest, RunStatus


@pytest.fixture(scope="module", params=[
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap unusable here")),
    pytest.param("unshare", marks=pytest.mark.skipif(not IS_ROOT, reason="the fallback isolates fully only as root")),
])
def sandbox(request):
    """Both isolation modes: they reach the same answers by different means (bubblewrap's init, the
    fallback's own)."""
    with EmbeddedSandbox(SandboxConfig(isolation=request.param, pool_size=2)) as sb:
        yield sb


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def run(sb, code: str, **kw):
    return sb.run(RunCodeRequest(code=code, language=kw.pop("language", "python"), **kw))


@pytest.mark.parametrize("code", ["1/0", "x = [1]\nprint(x[5])", "def f():\n    return {}['k']\nf()"])
def test_tracebacks_match_the_interpreter_running_a_file(sandbox, tmp_path, code):
    # SandboxFusion runs `python file.py`: the traceback must be the one that prints, carets included,
    # also for a last line without a newline.
    (tmp_path / "main.py").write_text(code)
    real = subprocess.run([sandbox.interpreter.path, "main.py"], cwd=tmp_path, capture_output=True, text=True)
    r = run(sandbox, code)
    assert r.run_result.return_code == real.returncode == 1
    assert r.run_result.stderr == real.stderr.replace(str(tmp_path / "main.py"), "main.py")


@pytest.mark.parametrize("files", [
    {"data.txt": "not base64!"},  # padding error
    {"": b64("x")},  # an empty path
    {"a": b64("file"), "a/b": b64("below a file")},  # a file where a folder must be
    {"/usr/lib/new.txt": b64("x")},  # the sandbox's read-only /usr
])
def test_malformed_files_are_a_sandbox_error(sandbox, files):
    r = run(sandbox, "print('must not run')", files=files)
    assert r.status == RunStatus.SandboxError and r.run_result is None
    assert r.message.startswith("exception on running code")


def test_absolute_and_relative_paths_map_into_the_sandbox(sandbox):
    # As SandboxFusion's test_python_fetch_files: absolute paths are paths in the sandbox's own root.
    code = ("print(open('/data/in.txt').read(), open('../up.txt').read())\n"
            "open('a.txt', 'w').write('secret')\nopen('/data/b', 'w').write('sauce')")
    r = run(sandbox, code, files={"/data/in.txt": b64("in"), "../up.txt": b64("up"), "skipped.txt": None},
            fetch_files=["a.txt", "/data/b", "/sandbox/a.txt", "skipped.txt", "/nowhere"])
    assert r.status == RunStatus.Success, r.run_result.stderr
    assert r.run_result.stdout == "in up\n"
    assert {k: base64.b64decode(v).decode() for k, v in r.files.items()} == {
        "a.txt": "secret", "/data/b": "sauce", "/sandbox/a.txt": "secret"}
    assert not os.path.exists("/data/b")  # the host's root is untouched


@pytest.mark.parametrize(("language", "code", "signal", "stdout"), [
    ("python", "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)", 15, "before\n"),
    ("python", "import ctypes\nctypes.string_at(0)", 11, ""),
    ("bash", "echo before; kill -9 $$", 9, "before\n"),
])
def test_a_signal_death_reports_minus_n(sandbox, language, code, signal, stdout):
    r = run(sandbox, code, language=language)
    assert (r.status, r.message, r.run_result.status) == (RunStatus.Failed, "", CommandRunStatus.Finished)
    assert (r.run_result.return_code, r.run_result.stdout) == (-signal, stdout)


def test_limits_leave_message_empty_over_http(server):
    cases = [({"code": "while True: pass", "run_timeout": 1}, None),
             ({"code": "x = bytearray(300 * 1024 * 1024)", "memory_limit_MB": 100}, 1),
             ({"code": "import os; os.kill(os.getpid(), 24)"}, -24)]
    for body, code in cases:
        answer = httpx.post(f"{server.url}/run_code", json={"language": "python", **body}, timeout=30).json()
        assert answer["status"] == "Failed" and answer["message"] == ""
        assert answer["run_result"]["return_code"] == code
        assert "detail" not in answer


def with_urls(body: object) -> object:
    """A 422 body as SandboxFusion's pinned FastAPI 0.103 and pydantic 2.6 send it: each pydantic
    error keeps its ``url`` (newer FastAPI drops it); the JSON decode error, made by FastAPI itself,
    has none. (Checked against fastapi==0.103.2, pydantic==2.6.4 with the same request model.)"""
    if not isinstance(body, dict) or not isinstance(body.get("detail"), list):
        return body
    version = ".".join(pydantic.VERSION.split(".")[:2])
    return {"detail": [e if e["type"] == "json_invalid" else {**e, "url": f"https://errors.pydantic.dev/{version}/v/{e['type']}"}
                       for e in body["detail"]]}


def test_http_errors_have_fastapi_shapes(server):
    """SandboxFusion is a FastAPI app: the same request model behind FastAPI must answer alike. (The
    isolation mode plays no part: these requests never reach a sandbox.)"""
    fastapi = pytest.importorskip("fastapi", reason="the reference app needs fastapi (the test extra)")
    from fastapi.testclient import TestClient

    reference = fastapi.FastAPI()

    @reference.post("/run_code")
    async def run_code(request: RunCodeRequest) -> dict:
        return {}

    @reference.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    cases = [
        ("GET", "/run_code", {}), ("POST", "/nowhere", {}), ("POST", "/v1/ping", {}), ("DELETE", "/run_code", {}),
        ("POST", "/run_code", {"json": {"language": "python"}}),
        ("POST", "/run_code", {"json": {"code": "x", "language": "cobol"}}),
        ("POST", "/run_code", {"json": [1]}),
        ("POST", "/run_code", {"json": {"code": 1, "language": "python", "run_timeout": "slow", "files": {"a": 3}}}),
        ("POST", "/run_code", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        ("POST", "/run_code", {"content": b""}),
        ("POST", "/run_code", {"content": b"code=1", "headers": {"content-type": "text/plain"}}),
    ]
    with TestClient(reference) as ref, httpx.Client(base_url=server.url, timeout=30) as ours:
        for method, path, kwargs in cases:
            want, got = ref.request(method, path, **kwargs), ours.request(method, path, **kwargs)
            assert got.status_code == want.status_code in (404, 405, 422), (method, path, kwargs)
            assert got.json() == with_urls(want.json()), (method, path, kwargs)
            assert got.headers.get("allow") == want.headers.get("allow")
