"""What ``toolrl sandbox serve`` added to close its gaps with SandboxFusion: Go's shared build cache,
``/run_jupyter``, ``junit``, a clear answer for ``jest``, and the memory default (a limit that counts
committed memory, so a runaway allocation stops while a JVM, which reserves far more address space
than it uses, still runs). Toolchains absent here skip with the reason."""

from __future__ import annotations

import dataclasses
import shutil
import time

import httpx
import pytest
from sandbox_support import ServerProcess, start_server, stop_server
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.embedded import languages as languages_module
from toolrl_sandbox_fusion.models import (
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)


@pytest.fixture(scope="module")
def server():
    srv = start_server("--pool-size", "1")
    try:
        yield srv
    finally:
        stop_server(srv)


def post(server: ServerProcess, path: str, body: dict) -> dict:
    reply = httpx.post(f"{server.url}{path}", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def run_code(server: ServerProcess, **fields) -> RunCodeResponse:
    return RunCodeResponse.model_validate(post(server, "/run_code", fields))


def java_usable() -> bool:
    return shutil.which("java") is not None and shutil.which("javac") is not None


GO_HELLO = 'package main\n\nimport "fmt"\n\nfunc main() {{ fmt.Println("hello {n}") }}\n'
# A run trying to change the shared cache (a new entry, an existing one overwritten) must fail.
GO_POISON = """package main

import (
\t"fmt"
\t"os"
\t"path/filepath"
)

func main() {
\tcache := os.Getenv("GOCACHE")
\tentries, _ := filepath.Glob(filepath.Join(cache, "*", "*"))
\tfmt.Println(cache, len(entries) > 0)
\tfmt.Println(os.WriteFile(filepath.Join(cache, "poison"), []byte("x"), 0o644) != nil)
\tif len(entries) > 0 {
\t\tfmt.Println(os.WriteFile(entries[0], []byte("x"), 0o644) != nil)
\t}
}
"""


@pytest.mark.skipif(shutil.which("go") is None, reason="go not installed here (apt-get install -y golang-go)")
def test_go_runs_share_a_warm_read_only_build_cache(server):
    first = run_code(server, language="go", code=GO_HELLO.format(n=0), compile_timeout=600)
    assert first.status == RunStatus.Success, (first.message, first.compile_result)
    for n in (1, 2):  # a new program each time: only the cached packages are reused
        start = time.monotonic()
        result = run_code(server, language="go", code=GO_HELLO.format(n=n))
        elapsed = time.monotonic() - start
        assert result.run_result.stdout == f"hello {n}\n", (result.message, result.compile_result)
        assert elapsed < 3, f"Go hello world took {elapsed:.1f} s after the first"
    poison = run_code(server, language="go", code=GO_POISON)
    assert poison.run_result.stdout == "/run/toolrl/go-build true\ntrue\ntrue\n", (poison.compile_result, poison.run_result)
    tested = run_code(server, language="go_test", code='package main\n\nimport "testing"\n\n'
                                                       'func TestOne(t *testing.T) { if 1 != 1 { t.Fail() } }\n')
    assert tested.status == RunStatus.Success and tested.run_result.stdout.startswith("ok"), tested.run_result


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("go") is None, reason="go not installed here (apt-get install -y golang-go)")
def test_go_with_no_compiled_standard_library_is_fast_after_the_warm_up(monkeypatch):
    # Go 1.20+ ships no compiled standard library; -trimpath makes an older Go rebuild it too, so this
    # is the 30-second first build the cache exists for, on any Go.
    for name in ("go", "go_test"):
        spec = languages_module.LANGUAGES[name]
        monkeypatch.setitem(languages_module.LANGUAGES, name,
                            dataclasses.replace(spec, env=(*spec.env, ("GOFLAGS", "-trimpath"))))
    with EmbeddedSandbox(SandboxConfig(pool_size=1)) as sandbox:
        first = sandbox.run(RunCodeRequest(language="go", code=GO_HELLO.format(n=0)))
        assert first.status == RunStatus.Success, (first.message, first.compile_result)
        start = time.monotonic()
        second = sandbox.run(RunCodeRequest(language="go", code=GO_HELLO.format(n=1)))
        elapsed = time.monotonic() - start
    assert second.run_result.stdout == "hello 1\n" and elapsed < 3, (elapsed, second.compile_result)


def test_run_jupyter_runs_cells_in_one_kernel(server):
    # SandboxFusion's test_jupyter_multi_cell_raise, with a display and a cut-short cell.
    body = post(server, "/run_jupyter", RunJupyterRequest(cells=[
        'a = "hello"', "a", "import sys\nsys.stderr.write('to stderr\\n')", "assert False", "print(a)",
    ]).model_dump())
    result = RunJupyterResponse.model_validate(body)
    if result.status == RunStatus.SandboxError:
        pytest.skip(f"no Jupyter kernel here: {result.message}")
    assert result.status == RunStatus.Success, result
    assert [c.stdout for c in result.cells] == ["", "", "", "", "hello\n"]
    assert result.cells[1].display == [{"text/plain": "'hello'"}]
    assert result.cells[2].stderr == "to stderr\n"
    assert result.cells[3].error[0]["ename"] == "AssertionError" and result.cells[4].error == []
    assert result.driver.status == CommandRunStatus.Finished
    slow = RunJupyterResponse.model_validate(post(server, "/run_jupyter", {
        "cells": ["x = 1", "import time; time.sleep(30)", "print(x)"], "cell_timeout": 1}))
    assert slow.status == RunStatus.Failed and len(slow.cells) == 2, slow


JUNIT = """
import org.junit.jupiter.api.Test;
import static org.junit.jupiter.api.Assertions.*;

public class Twice {
    static int of(int x) { return 2 * x; }
}

class TwiceTest {
    @Test
    void doubles() { assertEquals(42, Twice.of(21)); }

    @Test
    void fails() { assertEquals(3, Twice.of(1)); }
}
"""


@pytest.mark.skipif(not java_usable(), reason="no JDK here (apt-get install -y default-jdk-headless)")
def test_junit_runs_the_tests_of_the_code(server):
    if not any(p.is_file() for p in map(__import__("pathlib").Path, languages_module.JUNIT_LAUNCHERS)):
        pytest.skip("JUnit console launcher not installed here (apt-get install -y junit5)")
    # One run (each costs two JVM starts): the file is named after the public class, the launcher finds
    # both tests, and one failing test fails the run.
    result = run_code(server, language="junit", code=JUNIT, compile_timeout=60, run_timeout=30)
    assert result.compile_result.return_code == 0, result.compile_result
    assert result.status == RunStatus.Failed, (result.compile_result, result.run_result)
    assert "1 tests successful" in result.run_result.stdout and "1 tests failed" in result.run_result.stdout


def test_jest_says_why_it_cannot_run(server):
    result = run_code(server, language="jest", code="test('x', () => {});")
    assert result.status == RunStatus.SandboxError
    assert "jest" in result.message and "npm" in result.message and "not supported" in result.message


def test_the_default_memory_limit_stops_a_runaway_allocation_and_lets_java_run(server):
    code = "data = bytearray(2 << 30)\ndata[::4096] = b'x' * len(data[::4096])\nprint('allocated')"
    stopped = run_code(server, language="python", code=code)  # names no limit: the 1024 MB default
    assert stopped.status == RunStatus.Failed and "MemoryError" in stopped.run_result.stderr
    # Shared anonymous memory escapes RLIMIT_DATA: the address-space backstop (limit + 4 GB) refuses it.
    shared = run_code(server, language="python", code="import mmap\ntry:\n    mmap.mmap(-1, 6 << 30)\n"
                      "    print('mapped')\nexcept OSError as exc:\n    print(exc.errno)")
    assert shared.run_result.stdout == "12\n", shared.run_result  # ENOMEM
    unlimited = run_code(server, language="python", code="import resource\n"
                         "print(resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY)",
                         memory_limit_MB=-1)
    assert unlimited.run_result.stdout == "True\n"
    if not java_usable():
        pytest.skip("no JDK here: the Java half is not checked")
    java = run_code(server, language="java", compile_timeout=60, code=(
        "public class Main {\n    public static void main(String[] a) {\n"
        "        System.out.println(\"hello \" + (Runtime.getRuntime().maxMemory() <= (1L << 30)));\n    }\n}"))
    assert java.status == RunStatus.Success, (java.compile_result, java.run_result)
    assert java.run_result.stdout == "hello true\n"
