"""SandboxFusion's own runner tests (sandbox/tests/runners/test_python.py, test_bash.py,
test_isolation.py, test_pytest.py, test_cpp.py, test_java.py, test_nodejs.py...) where
``toolrl sandbox serve`` used to answer differently, restated in our words against the server in
both isolation modes: a request as SandboxFusion's tests send it, the response read with its model.

SandboxFusion's isolation tests use ``requests``; the default sandbox interpreter (the system
Python) has none, so these use ``urllib`` for the same requests.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET

import httpx
import pytest
from sandbox_support import HAVE_BWRAP, IS_ROOT, ServerProcess, start_server, stop_server
from toolrl_sandbox_fusion.models import CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus


@pytest.fixture(scope="module", params=[
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap unusable here")),
    pytest.param("unshare", marks=pytest.mark.skipif(not IS_ROOT, reason="the fallback isolates fully only as root")),
])
def server(request):
    srv = start_server("--isolation", request.param, "--pool-size", "2")
    try:
        yield srv
    finally:
        stop_server(srv)


def run_code(server: ServerProcess, **fields) -> RunCodeResponse:
    request = RunCodeRequest(**{"run_timeout": 10, "compile_timeout": 60, **fields})
    reply = httpx.post(f"{server.url}/run_code", json=request.model_dump(), timeout=180)
    assert reply.status_code == 200, reply.text
    return RunCodeResponse.model_validate(reply.json())


# -- files: test_python_fetch_files ------------------------------------------------------------------

def test_fetch_files_the_code_wrote_at_absolute_paths(server):
    # SandboxFusion's code writes /mnt/b with no `files` entry naming /mnt: the folder is there.
    code = 'open("a.txt", "w").write("secret"); open("/mnt/b", "w").write("sauce"); open("/opt/c", "w").write("c")'
    result = run_code(server, language="python", code=code, fetch_files=["a.txt", "/mnt/b", "/opt/c"])
    assert result.status == RunStatus.Success, result.run_result
    assert {k: base64.b64decode(v).decode() for k, v in result.files.items()} == {
        "a.txt": "secret", "/mnt/b": "sauce", "/opt/c": "c"}


# -- network: test_isolation.py ----------------------------------------------------------------------

SERVE_AND_FETCH = """
import http.server, socketserver, threading, time, urllib.request

class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'Hello, this is a special string!')

    def log_message(self, *args):
        pass

server = socketserver.TCPServer(("", {port}), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
time.sleep({wait})
for host in ("127.0.0.1", "localhost"):
    try:
        body = urllib.request.urlopen(f"http://{{host}}:{port}", timeout=5).read().decode()
        print(host, "Test Passed" if "special string" in body else "Test Failed")
    except OSError as exc:
        print(host, "Test Failed:", exc)
"""


def test_a_server_in_the_sandbox_answers_on_loopback(server):
    # test_isolation_network_server_127 and _localhost: serve in a thread, fetch by address and by name.
    result = run_code(server, language="python", code=SERVE_AND_FETCH.format(port=41234, wait=0.2))
    assert result.status == RunStatus.Success, result.run_result
    assert result.run_result.stdout == "127.0.0.1 Test Passed\nlocalhost Test Passed\n"


def test_two_sandboxes_serve_on_the_same_port(server):
    # test_isolation_network_server_port_conflict: each run has its own network namespace.
    results: list[RunCodeResponse] = []
    code = SERVE_AND_FETCH.format(port=42345, wait=1.0)
    threads = [threading.Thread(target=lambda: results.append(run_code(server, language="python", code=code)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.run_result.stdout for r in results] == ["127.0.0.1 Test Passed\nlocalhost Test Passed\n"] * 2


def test_host_name_resolves_and_the_user_has_a_name(server):
    code = "import getpass, socket\nprint(socket.gethostname(), socket.gethostbyname(socket.gethostname()), getpass.getuser())"
    result = run_code(server, language="python", code=code)
    assert result.run_result.stdout == "sandbox 127.0.1.1 nobody\n", result.run_result


# -- bash: scripts call what SandboxFusion's runtime has on PATH ---------------------------------------

def test_bash_scripts_call_python_and_pytest(server):
    code = "python -c 'print(6 * 7)'\npython3 -c 'import sys; print(sys.version_info[0])'\npytest --version\n"
    result = run_code(server, language="bash", code=code)
    assert result.status == RunStatus.Success, result.run_result
    lines = result.run_result.stdout.splitlines()
    assert lines[:2] == ["42", "3"] and lines[2].startswith("pytest ")


# -- pytest: test_pytest.py ----------------------------------------------------------------------------

WORD_COUNT = '''
import string
from collections import Counter


def word_count(file_path):
    with open(file_path, 'r', encoding='utf-8') as file:
        content = file.read().translate(str.maketrans("", "", string.punctuation)).lower()
    for word, count in sorted(Counter(content.split()).items(), key=lambda x: x[1], reverse=True):
        print(f"'{word}': {count}")


class TestWordCount:
    def test_case_insensitive(self, capfd, tmp_path):
        path = tmp_path / 'case.txt'
        path.write_text("Case case CASE", encoding='utf-8')
        word_count(path)
        assert ("'case': 3" in capfd.readouterr().out) is EXPECTED

    def test_punctuation(self, capfd, tmp_path):
        path = tmp_path / 'punctuation.txt'
        path.write_text("This sentence has punctuation, like commas.", encoding='utf-8')
        word_count(path)
        assert ("'punctuation': 1\\n'like': 1\\n'commas': 1\\n" in capfd.readouterr().out) is EXPECTED
'''


@pytest.mark.parametrize(("expected", "status"), [("True", RunStatus.Success), ("False", RunStatus.Failed)])
def test_pytest_passes_and_fails(server, expected, status):
    code = f"EXPECTED = {expected}\n{WORD_COUNT}"
    assert run_code(server, language="python", code=code).status == RunStatus.Success  # as plain python: no tests run
    result = run_code(server, language="pytest", code=code)
    assert result.status == status, result.run_result
    assert ("2 passed" if expected == "True" else "2 failed") in result.run_result.stdout


def test_pytest_args_select_tests_and_write_a_fetched_report(server):
    code = "def test_requested():\n    assert True\n\n\ndef test_unselected_failure():\n    assert False\n"
    result = run_code(server, language="pytest", code=code, args=["-k", "test_requested", "--junitxml=report.xml"],
                      fetch_files=["report.xml"])
    assert result.status == RunStatus.Success, result.run_result
    suite = ET.fromstring(base64.b64decode(result.files["report.xml"])).find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("1", "0")


# -- other languages: present toolchains run, absent ones say so ----------------------------------------

def runs(command: str) -> bool:
    """On the PATH and answering ``--version``: a rustup shim with no toolchain for this HOME is not."""
    path = shutil.which(command)
    try:
        return path is not None and subprocess.run([path, "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def needs(*commands: str):
    return pytest.mark.skipif(not all(runs(c) for c in commands), reason=f"{', '.join(commands)} not usable here")


CPP_ECHO = "#include <iostream>\nint main() { int n; std::cin >> n; std::cout << n << std::endl; return 0; }"
JAVA_ECHO = ("import java.util.Scanner;\npublic class Main {\n    public static void main(String[] args) {\n"
             "        System.out.println(new Scanner(System.in).nextInt());\n    }\n}")
NODE_ECHO = "process.stdin.on('data', (input) => { console.log(parseInt(input.toString())); process.exit(); });"


@pytest.mark.parametrize(("language", "code", "compiled"), [
    pytest.param("cpp", CPP_ECHO, True, marks=needs("g++")),
    pytest.param("java", JAVA_ECHO, True, marks=needs("javac", "java")),
    pytest.param("nodejs", NODE_ECHO, False, marks=needs("node")),
    pytest.param("rust", "fn main() { let mut s = String::new(); std::io::stdin().read_line(&mut s).unwrap(); "
                         "println!(\"{}\", s.trim()); }", True, marks=needs("rustc")),
    pytest.param("perl", "my $n = <STDIN>; print $n + 0, \"\\n\";", False, marks=needs("perl")),
])
def test_present_toolchains_run_with_stdin(server, language, code, compiled):
    # test_cpp_stdin, test_java_stdin, test_nodejs_stdin...: the toolchain is the host's, read-only.
    result = run_code(server, language=language, code=code, stdin="65535")
    assert result.status == RunStatus.Success, (result.message, result.compile_result, result.run_result)
    assert result.run_result.stdout == "65535\n"
    assert (result.compile_result is not None) == compiled
    if compiled:
        assert (result.compile_result.status, result.compile_result.return_code) == (CommandRunStatus.Finished, 0)


@pytest.mark.parametrize(("language", "code", "says"), [
    pytest.param("cpp", "int main() {\n    object i = ?;\n    return 0;\n}", "error", marks=needs("g++")),
    pytest.param("java", "public class Main {\n    public static void main(String[] args) {\n"
                         "        System.uto.println(123);\n    }\n}", "error: cannot find symbol",
                 marks=needs("javac", "java")),
])
def test_compile_errors_have_a_compile_result_and_no_run(server, language, code, says):
    result = run_code(server, language=language, code=code)
    assert result.status == RunStatus.Failed and result.run_result is None
    assert result.compile_result.status == CommandRunStatus.Finished and result.compile_result.return_code != 0
    assert says in result.compile_result.stderr + result.compile_result.stdout


@needs("g++")
def test_compiled_time_limits(server):
    # test_cpp_timeout: the run limit starts once the compiler is done; a compile limit of its own.
    code = ("#include <chrono>\n#include <thread>\nint main() { "
            "std::this_thread::sleep_for(std::chrono::milliseconds(1000)); return 0; }")
    result = run_code(server, language="cpp", code=code, run_timeout=0.5, compile_timeout=60)
    assert result.status == RunStatus.Failed
    assert result.compile_result.return_code == 0 and result.run_result.status == CommandRunStatus.TimeLimitExceeded
    result = run_code(server, language="cpp", code=code, compile_timeout=0.01)
    assert result.status == RunStatus.Failed and result.run_result is None
    assert result.compile_result.status == CommandRunStatus.TimeLimitExceeded


@needs("javac", "java", "jar")
def test_java_assertions_are_enabled_and_request_jars_on_the_class_path(server, tmp_path):
    # test_java_assert (java -ea) and test_java_external_jar (a request's .jar is on the class path).
    result = run_code(server, language="java", code="public class Main {\n    public static void main(String[] a) {\n"
                                                    "        assert 1 == 2;\n    }\n}")
    assert result.status == RunStatus.Failed and "java.lang.AssertionError" in result.run_result.stderr
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "Twice.java").write_text("package lib;\npublic class Twice { public static int of(int x) "
                                                 "{ return 2 * x; } }\n")
    subprocess.run(["javac", "lib/Twice.java"], cwd=tmp_path, check=True)
    subprocess.run(["jar", "cf", "twice.jar", "lib/Twice.class"], cwd=tmp_path, check=True)
    jar = base64.b64encode((tmp_path / "twice.jar").read_bytes()).decode()
    result = run_code(server, language="java", files={"twice.jar": jar},
                      code="public class Main {\n    public static void main(String[] a) {\n"
                           "        System.out.println(lib.Twice.of(21));\n    }\n}")
    assert result.run_result.stdout == "42\n", (result.compile_result, result.run_result)


@pytest.mark.parametrize(("language", "command"), [("go", "go"), ("go_test", "go"), ("php", "php"),
                                                   ("ruby", "ruby"), ("typescript", "tsx"), ("lua", "lua")])
def test_absent_toolchains_are_a_clear_sandbox_error(server, language, command):
    if shutil.which(command):
        pytest.skip(f"{command} is installed here")
    result = run_code(server, language=language, code="x")
    assert result.status == RunStatus.SandboxError and result.run_result is None
    assert result.message == (f"language {language!r} cannot run here: {command} is not installed "
                              "(not found on the PATH of the process running the sandbox)")


@pytest.mark.parametrize(("language", "why"), [("jest", "only from npm"), ("cuda", "needs a GPU"),
                                               ("lean", "Lean project")])
def test_languages_needing_sandboxfusions_image_say_why(server, language, why):
    result = run_code(server, language=language, code="x")
    assert result.status == RunStatus.SandboxError and why in result.message


# -- output and memory as SandboxFusion reports them ---------------------------------------------------

def test_output_that_is_not_utf8_is_a_decode_error(server):
    code = "import sys\nsys.stdout.buffer.write(b'ok \\xff\\n')\nsys.stderr.buffer.write(b'\\xc3')"
    result = run_code(server, language="python", code=code)
    expected = []
    for data in (b"ok \xff\n", b"\xc3"):
        with pytest.raises(UnicodeDecodeError) as error:
            data.decode()
        expected.append(f"[DecodeError] {error.value}")
    assert [result.run_result.stdout, result.run_result.stderr] == expected


@pytest.mark.parametrize("memory_limit_mb", [-1, 0])
def test_memory_limit_minus_one_means_no_limit(server, memory_limit_mb):
    code = ("import resource\nprint(resource.getrlimit(resource.RLIMIT_DATA) == (resource.RLIM_INFINITY,) * 2)\n"
            "data = bytearray(1536 * 1024 * 1024)  # zero pages: address space, hardly any memory\nprint(len(data) >> 20)")
    result = run_code(server, language="python", code=code, memory_limit_MB=memory_limit_mb)
    assert result.status == RunStatus.Success, result.run_result
    assert result.run_result.stdout == "True\n1536\n"
    limited = run_code(server, language="python", code=code, memory_limit_MB=512)
    assert limited.run_result.stdout == "False\n" and "MemoryError" in limited.run_result.stderr
