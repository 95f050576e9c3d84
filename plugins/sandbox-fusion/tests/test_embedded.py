"""The embedded sandbox: SandboxFusion result semantics, isolation properties, one process per run."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import tempfile
import time

import pytest
from sandbox_support import HAVE_BWRAP, IS_ROOT, fake_spawn, requires_bwrap
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig, SandboxLimits
from toolrl_sandbox_fusion.embedded.pool import ProcessPool, SandboxProcess
from toolrl_sandbox_fusion.models import CommandRunStatus, RunCodeRequest, RunStatus


def run(sb: EmbeddedSandbox, code: str, **kw):
    return sb.run(RunCodeRequest(code=code, language=kw.pop("language", "python"), **kw))


def test_print_succeeds(sandbox):
    r = run(sandbox, "print(1+1)")
    assert r.status == RunStatus.Success and r.message == ""
    assert r.run_result.status == CommandRunStatus.Finished
    assert (r.run_result.stdout, r.run_result.stderr, r.run_result.return_code) == ("2\n", "", 0)
    assert 0 < r.run_result.execution_time < 5


def test_exit_codes_and_tracebacks(sandbox):
    r = run(sandbox, "import sys\nprint('partial')\nsys.exit(3)")
    assert (r.status, r.run_result.return_code, r.run_result.stdout) == (RunStatus.Failed, 3, "partial\n")
    r = run(sandbox, "def f():\n    return 1/0\nf()")
    assert r.status == RunStatus.Failed and r.run_result.return_code == 1
    # The model sees its own frames with source lines, not the sandbox's bootstrap.
    assert 'File "main.py", line 3, in <module>' in r.run_result.stderr
    assert "return 1/0" in r.run_result.stderr and "ZeroDivisionError" in r.run_result.stderr
    assert "bootstrap" not in r.run_result.stderr and "<string>" not in r.run_result.stderr
    r = run(sandbox, "print(")
    assert r.run_result.return_code == 1 and "SyntaxError" in r.run_result.stderr
    assert r.run_result.stderr.lstrip().startswith('File "main.py", line 1')


def test_interpreter_exit_semantics(sandbox):
    # The sandbox exits without interpreter teardown; what a program can observe of it must remain.
    r = run(sandbox, "import atexit\natexit.register(print, 'bye')\nprint('hi')")
    assert r.run_result.stdout == "hi\nbye\n"
    r = run(sandbox, "import threading, time\ndef work():\n    time.sleep(0.2)\n    print('thread done')\n"
                     "threading.Thread(target=work).start()")
    assert r.run_result.stdout == "thread done\n"
    r = run(sandbox, "import sys\nsys.exit('fatal: bad input')")
    assert (r.run_result.return_code, r.run_result.stderr) == (1, "fatal: bad input\n")
    r = run(sandbox, "import os\nprint('unflushed', end='')\nos._exit(4)")  # no report: the exit status counts
    assert r.run_result.return_code == 4 and r.status == RunStatus.Failed
    r = run(sandbox, "import sys\nsys.stdout.write('x' * 300000)")  # more than a pipe holds, then exit
    assert len(r.run_result.stdout) == 300000


def test_main_module_semantics(sandbox):
    code = "import sys\nprint(__name__, __file__, sys.argv)\nif __name__ == '__main__':\n    print('main')"
    r = run(sandbox, code, args=["a", "b"])
    assert r.run_result.stdout == "__main__ main.py ['main.py', 'a', 'b']\nmain\n"


def test_stdin_files_and_fetch_files(sandbox):
    code = ("import sys\ndata = open('in/data.txt').read()\nline = sys.stdin.readline().strip()\n"
            "f = open('out.txt', 'w')\nf.write(data.upper() + line)\n")  # left open: flushed before fetch
    r = run(sandbox, code, stdin="from-stdin\n", files={"in/data.txt": base64.b64encode(b"abc").decode()},
            fetch_files=["out.txt", "absent.txt"])
    assert r.status == RunStatus.Success, r.run_result.stderr
    assert base64.b64decode(r.files["out.txt"]) == b"ABCfrom-stdin"
    assert "absent.txt" not in r.files


def test_bash_and_unsupported_languages(sandbox):
    r = run(sandbox, "echo $((6*7)); echo err >&2; exit 5", language="bash")
    assert (r.status, r.run_result.return_code, r.run_result.stdout, r.run_result.stderr) == (
        RunStatus.Failed, 5, "42\n", "err\n")
    r = run(sandbox, "__global__ void k(){}", language="cuda")
    assert r.status == RunStatus.SandboxError and "not supported" in r.message and r.run_result is None


def test_wall_time_limit_is_reported_as_time_limit_exceeded(sandbox):
    r = run(sandbox, "print('started', flush=True)\nwhile True: pass", run_timeout=1)
    assert r.status == RunStatus.Failed
    assert r.run_result.status == CommandRunStatus.TimeLimitExceeded and r.run_result.return_code is None
    assert 0.9 < r.run_result.execution_time < 3
    assert r.run_result.stdout == "started\n"  # output before the kill is kept
    assert "time limit of 1 s exceeded" in r.detail and r.message == ""


def test_sleeping_past_the_limit_is_killed_too(sandbox):
    r = run(sandbox, "import time; time.sleep(30)", run_timeout=0.5)
    assert r.run_result.status == CommandRunStatus.TimeLimitExceeded and r.run_result.execution_time < 3


def test_memory_limit_from_the_request(sandbox):
    code = "x = bytearray(300 * 1024 * 1024)\nprint(len(x))"
    small = run(sandbox, code, memory_limit_MB=100)
    assert small.status == RunStatus.Failed and "MemoryError" in small.run_result.stderr
    assert "memory limit of 100 MB exceeded" in small.detail and small.message == ""
    big = run(sandbox, code, memory_limit_MB=1000)
    assert big.status == RunStatus.Success and big.run_result.stdout == f"{300 * 1024 * 1024}\n"


def test_output_cap_kills_the_run():
    config = SandboxConfig(pool_size=1, limits=SandboxLimits(max_output_bytes=100_000))
    with EmbeddedSandbox(config) as sb:
        r = run(sb, "while True: print('x' * 1000)", run_timeout=20)
    assert r.status == RunStatus.Failed and "output limit of 100000 bytes exceeded" in r.detail
    assert r.run_result.execution_time < 5
    assert len(r.run_result.stdout) == 100_000


def test_a_process_is_never_reused(sandbox):
    # A run that poisons its interpreter and its files; the next run must see none of it.
    poison = ("import builtins, os, sys\nbuiltins.print = None\nsys.modules['json'] = None\n"
              "os.environ['LEAK'] = '1'\nopen('leak.txt', 'w').write('x')\nopen('/tmp/leak', 'w').write('x')")
    assert run(sandbox, poison).status == RunStatus.Success
    r = run(sandbox, "import json, os\nprint(os.environ.get('LEAK'), os.path.exists('leak.txt'), "
                     "os.path.exists('/tmp/leak'), json.dumps(1))")
    assert r.run_result.stdout == "None False False 1\n"


def test_sandbox_identity_and_environment(sandbox):
    code = ("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nprint(sorted(os.environ))\n"
            "print(os.getcwd() == os.environ['HOME'])")
    r = run(sandbox, code)
    uid_line, env_line, home_line = r.run_result.stdout.splitlines()
    if sandbox.mode == "bwrap" or IS_ROOT:  # the non-root fallback keeps the caller's uid
        assert uid_line == "65534 65534 []"
    assert set(eval(env_line)) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PWD"}
    assert home_line == "True"


async def test_concurrent_runs(sandbox):
    codes = [f"import time; time.sleep(0.2); print({i} * 2)" for i in range(8)]
    results = await asyncio.gather(*(sandbox.arun(RunCodeRequest(code=c, language="python")) for c in codes))
    assert [r.run_result.stdout for r in results] == [f"{i * 2}\n" for i in range(8)]


def test_pool_reports_why_sandboxes_cannot_start(tmp_path):
    missing = tmp_path / "python-that-does-not-start"
    missing.write_text("#!/bin/sh\necho cannot start >&2\nexit 3\n")
    missing.chmod(0o755)
    config = SandboxConfig(isolation="unshare", pool_size=1, interpreter=str(missing), start_timeout=10)
    with EmbeddedSandbox(config) as sb:
        r = run(sb, "print(1)")
    assert r.status == RunStatus.SandboxError
    assert "sandbox unavailable" in r.message and "cannot start" in r.message


def test_forked_child_gets_its_own_pool(sandbox):
    assert run(sandbox, "print(1)").status == RunStatus.Success
    pid = os.fork()
    if pid == 0:  # the parent's pooled processes are not the child's children: it must start its own
        try:
            ok = run(sandbox, "print(7)").run_result.stdout == "7\n"
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert run(sandbox, "print(2)").run_result.stdout == "2\n"


@pytest.mark.parametrize("isolation", [
    pytest.param("bwrap", marks=requires_bwrap),
    pytest.param("unshare", marks=pytest.mark.skipif(not IS_ROOT, reason="the fallback drops to uid 65534 as root")),
])
def test_both_modes_see_only_usr_and_their_own_tmpfs(isolation):
    code = ("import os\nprint(sorted(os.listdir('/')), os.getcwd(), os.getuid())\n"
            "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            "print(sorted(os.listdir('/dev')))\nopen('/dev/null', 'w').write('x')\n"
            "print(open('/dev/urandom', 'rb').read(4).__len__())")
    with EmbeddedSandbox(SandboxConfig(isolation=isolation, pool_size=1)) as sb:
        r = run(sb, code)
        assert sb.mode == isolation
        mounted = {target.split("/")[1] for _, target in sb.toolchains.mounts}
        mounted |= {folder.split("/")[1] for folder in sb.interpreter.mounts}
    root, pids, dev, urandom = r.run_result.stdout.splitlines()
    names, cwd, uid = root.rsplit(" ", 2)
    # /usr, the sandbox's own (empty) folders, and where the interpreter and the toolchains are mounted
    assert set(eval(names)) <= {"bin", "dev", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sbin", "tmp",
                                "usr", "etc", "home", "media", "mnt", "opt", "run", "srv", "var"} | mounted
    assert (cwd, uid) == ("/sandbox", "65534")
    assert pids == "[1, 2]"  # its own PID namespace: an init and the program
    assert {"null", "zero", "urandom", "shm"} <= set(eval(dev)) and urandom == "4"


WORLD = r"""
import json, os, resource, shutil, socket, stat
def listing(folder):
    return sorted((n, stat.filemode(os.lstat(os.path.join(folder, n)).st_mode)) for n in os.listdir(folder))
def connect(host):
    server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    try:
        socket.create_connection((host, server.getsockname()[1]), timeout=2).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__
status = dict(line.split(":	") for line in open("/proc/self/status").read().splitlines() if ":	" in line)
print(json.dumps({
    "root": listing("/"), "dev": listing("/dev"), "etc": [n for n, _ in listing("/etc")], "bin": listing("/run/toolrl/bin"),
    "tmp": [stat.filemode(os.stat(p).st_mode) for p in ("/tmp", "/dev/shm", "/sandbox")],
    "ids": [os.getuid(), os.getgid(), os.getgroups()], "host": [socket.gethostname(), socket.if_nameindex()],
    "owners": [(os.lstat(p).st_uid, os.lstat(p).st_gid) for p in ("/", "/usr", "/bin", "/proc", "/etc/hosts")],
    "env": dict(os.environ), "cwd": os.getcwd(),
    "caps": [status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")],
    "limits": [resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in ("AS", "CPU", "NOFILE", "FSIZE", "CORE")],
    "resolve": [socket.getaddrinfo(h, 80, socket.AF_INET)[0][4][0] for h in ("localhost", "sandbox")],
    "loopback": [connect(h) for h in ("127.0.0.1", "::1", "localhost")],
    "commands": {c: shutil.which(c) for c in ("python", "python3", "pytest", "bash", "sh", "cc", "awk", "env")},
}, indent=1))
"""


@pytest.mark.skipif(not (HAVE_BWRAP and IS_ROOT), reason="needs both modes: bubblewrap and the fallback as root")
def test_both_modes_give_code_the_same_world():
    """What code can observe of its surroundings is the same under bubblewrap and the fallback:
    folders, devices, /etc, names, identity, capabilities, limits, loopback, commands on PATH."""
    worlds = {}
    for isolation in ("bwrap", "unshare"):
        with EmbeddedSandbox(SandboxConfig(isolation=isolation, pool_size=1)) as sb:
            r = run(sb, WORLD, memory_limit_MB=512)
            assert sb.mode == isolation and r.status == RunStatus.Success, r.run_result
            worlds[isolation] = json.loads(r.run_result.stdout)
    assert worlds["bwrap"] == worlds["unshare"]
    world = worlds["bwrap"]
    assert world["loopback"] == ["connected"] * 3 and world["resolve"] == ["127.0.0.1", "127.0.1.1"]
    assert world["host"] == ["sandbox", [[1, "lo"]]] and world["caps"][3] == "0000000000000000"


def test_auto_mode_without_bubblewrap_warns_and_falls_back(monkeypatch, tmp_path, caplog):
    from toolrl_sandbox_fusion.embedded import launch

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    launch._probe_bwrap.cache_clear()
    interpreter = launch.Interpreter("/usr/bin/python3")
    try:
        with caplog.at_level("WARNING"):
            assert launch.choose_mode("auto", interpreter) == "unshare"
        with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
            launch.choose_mode("bwrap", interpreter)
    finally:
        launch._probe_bwrap.cache_clear()
    assert "bubblewrap is not installed" in caplog.text and "'unshare' fallback" in caplog.text


@requires_bwrap
def test_bubblewrap_outside_the_default_path_starts(monkeypatch):
    """The sandbox starts with an empty environment: bubblewrap must be run by its resolved path."""
    from toolrl_sandbox_fusion.embedded import launch

    folder = tempfile.mkdtemp(dir="/var/tmp")  # reachable by uid 65534, unlike pytest's tmp_path as root
    try:
        os.chmod(folder, 0o755)
        copy = shutil.copy(shutil.which("bwrap"), os.path.join(folder, "bwrap"))
        monkeypatch.setenv("PATH", f"{folder}:{os.path.dirname(shutil.which('setpriv') or '/usr/bin/setpriv')}")
        launch._probe_bwrap.cache_clear()
        with EmbeddedSandbox(SandboxConfig(isolation="bwrap", pool_size=1)) as sb:
            argv = launch.build_command("bwrap", sb.interpreter, sb.toolchains, sb.config.limits, 3)
            setpriv = argv[next(i for i, a in enumerate(argv) if os.path.basename(a) == "setpriv"):]
            assert setpriv[setpriv.index("--") + 1] == copy  # what setpriv runs: the resolved path
            assert run(sb, "print(6*7)").run_result.stdout == "42\n"
    finally:
        launch._probe_bwrap.cache_clear()
        shutil.rmtree(folder)


def test_pool_keeps_one_process_until_used_then_fills():
    spawned = []

    def spawn() -> SandboxProcess:
        return fake_spawn(spawned)

    pool = ProcessPool(spawn, size=4, refill_delay=0.01)
    try:
        time.sleep(1.0)
        assert len(spawned) == 1  # a one-off user starts one process, not four
        sp = pool.take(30)
        pool.done(sp)
        deadline = time.monotonic() + 30
        while len(pool._ready) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pool._ready) == 4 and len(spawned) == 5  # never reused: the used one was replaced
    finally:
        pool.close()
    assert all(p.poll() is not None for p in spawned)  # closing the pool ends every process
