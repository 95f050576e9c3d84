"""Hostile code: ten attacks, each contained and each reported to the model.

Every attack is bounded on its own, so a broken sandbox fails the test without taking the machine
down: the fork bomb stops at 400 children that exit after 30 s, the allocation refuses to run
without an address-space limit, the disk fill stops at 2 GB, the output flood dies at the wall
limit. "Reported to the model" is checked on the text the tool sends back (``render``).

The suite runs under bubblewrap (skipped when unusable) and under the ``unshare`` fallback as root:
both give the code the same fresh root, so every attack must end the same way in both.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from sandbox_support import HAVE_BWRAP, IS_ROOT
from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.models import CommandRunStatus, RunCodeRequest, RunStatus
from toolrl_sandbox_fusion.tool import outcome, render

SECRET = f"toolrl-secret-{uuid.uuid4().hex}"
MARKER = f"30.{uuid.uuid4().int % 10**8}"  # the fork bomb's children run `sleep MARKER`


@pytest.fixture(scope="module", params=[
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap unusable here")),
    pytest.param("unshare", marks=pytest.mark.skipif(not IS_ROOT, reason="the fallback isolates fully only as root")),
])
def box(request):
    # The secret is in this process's environment before any sandbox process starts.
    os.environ["TOOLRL_TEST_SECRET"] = SECRET
    try:
        with EmbeddedSandbox(SandboxConfig(isolation=request.param, pool_size=2)) as sb:
            sb.start()
            yield sb
    finally:
        del os.environ["TOOLRL_TEST_SECRET"]


def attack(sb: EmbeddedSandbox, code: str, timeout: float = 10):
    # The tool's default memory limit: what a model's code gets (-1, no limit, is SandboxFusion's default).
    response = sb.run(RunCodeRequest(code=code, language="python", run_timeout=timeout, memory_limit_MB=1024))
    return response, render(response, timeout, 1024)


def host_processes_with(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def test_fork_bomb(box):
    code = f"""
import os
children = 0
try:
    for _ in range(400):
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{MARKER}"])
        children += 1
except OSError as exc:
    print("fork refused after", children, "children:", exc)
print("children", children)
"""
    response, text = attack(box, code)
    children = int(response.run_result.stdout.split("children ")[-1])
    assert children < box.config.limits.max_processes, response.run_result.stdout
    assert "fork refused" in text and "Resource temporarily unavailable" in text
    deadline = time.monotonic() + 5  # SIGKILL delivery and reaping are asynchronous
    while host_processes_with(f"sleep {MARKER}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_with(f"sleep {MARKER}") == []  # nothing outlives the run


def test_ten_gigabyte_allocation(box):
    code = """
import resource
soft, _ = resource.getrlimit(resource.RLIMIT_AS)
assert 0 < soft <= 8 * 1024**3, f"no address-space limit ({soft}); refusing to allocate"
data = bytearray(10 * 1024**3)
print("allocated", len(data))
"""
    response, text = attack(box, code)
    assert response.status == RunStatus.Failed and "allocated" not in response.run_result.stdout
    assert "MemoryError" in response.run_result.stderr
    assert outcome(response) == "memory" and text.startswith("Error: memory limit exceeded")


def test_infinite_loop(box):
    response, text = attack(box, "while True:\n    pass", timeout=1)
    assert response.status == RunStatus.Failed
    assert response.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert response.run_result.execution_time < 5
    assert text.startswith("Error: time limit exceeded")


def test_disk_fill(box):
    code = """
import os
total = 0
for i, folder in enumerate((".", "/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~"))):
    for n in range(8):  # at most 8 files x 50 MB per folder, 2 GB in all
        try:
            with open(os.path.join(folder, f"fill-{i}-{n}.bin"), "wb") as f:
                for _ in range(50):
                    f.write(b"\\0" * (1 << 20))
                    total += 1 << 20
        except OSError as exc:
            print(folder, "stopped:", exc.strerror)
            break
print("total MB", total >> 20)
"""
    response, text = attack(box, code, timeout=30)
    total_mb = int(response.run_result.stdout.split("total MB ")[-1])
    lim = box.config.limits
    assert total_mb <= lim.workdir_mb + lim.tmp_mb + lim.shm_mb, response.run_result.stdout
    assert "No space left on device" in text


@pytest.fixture
def host_files():
    """A root-only secret and world-readable files: under /var/tmp, and in this project's checkout."""
    folder = Path(f"/var/tmp/toolrl-test-{uuid.uuid4().hex}")
    folder.mkdir(mode=0o755)
    secret, public = folder / "secret.txt", folder / "public.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    public.write_text("public-marker")
    public.chmod(0o644)
    checkout = Path(__file__).resolve()
    assert checkout.stat().st_mode & 0o004  # world-readable on the host
    try:
        yield secret, [public, checkout]
    finally:
        for path in (secret, public):
            path.unlink()
        folder.rmdir()


def test_reading_host_files(box, host_files):
    secret, public = host_files
    paths = [str(secret), "/etc/shadow", "/root/.bash_history", *map(str, public)]
    code = f"""
for path in {paths!r}:
    try:
        print(path, "READ", open(path).read()[:80])
    except OSError as exc:
        print(path, "denied:", exc.strerror)
"""
    response, text = attack(box, code)
    out = response.run_result.stdout
    assert SECRET not in out and SECRET not in text and "READ" not in out
    for path in paths:  # not even there: only /usr and the sandbox's own folders are
        assert f"{path} denied: No such file or directory" in out and f"{path} denied:" in text


def test_writing_outside(box, tmp_path):
    targets = [tmp_path / "escaped.txt", Path(f"/tmp/toolrl-escape-{uuid.uuid4().hex}"),
               Path(f"/var/tmp/toolrl-escape-{uuid.uuid4().hex}"), Path("/usr/toolrl-escape"),
               Path(f"/dev/shm/toolrl-escape-{uuid.uuid4().hex}"), Path("/etc/toolrl-escape")]
    code = f"""
for path in {[str(t) for t in targets]!r}:
    try:
        with open(path, "w") as f:
            f.write("escaped")
        print(path, "written (inside the sandbox)")
    except OSError as exc:
        print(path, "refused:", exc.strerror)
"""
    response, text = attack(box, code)
    for target in targets:
        assert not target.exists(), f"{target} was written on the host"
        assert str(target) in text


def test_connecting_to_localhost(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = f"""
import socket
for host, port in (("127.0.0.1", {port}), ("10.0.0.1", 80), ("1.1.1.1", 53)):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        print(host, "CONNECTED")
    except OSError as exc:
        print(host, "no connection:", exc.strerror or exc)
"""
    try:
        response, text = attack(box, code)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the host's listener
    finally:
        listener.close()
    assert "CONNECTED" not in response.run_result.stdout
    assert text.count("no connection:") == 3


def test_flooding_stdout(box):
    response, text = attack(box, "while True:\n    print('y' * 10000)", timeout=20)
    assert response.status == RunStatus.Failed and "output limit" in response.detail
    assert response.message == "" and response.run_result.return_code == -9  # SandboxFusion's wire format
    assert response.run_result.execution_time < 10
    assert len(response.run_result.stdout) + len(response.run_result.stderr) <= box.config.limits.max_output_bytes
    assert text.startswith("Error: output limit exceeded") and len(text) < 20_000


def test_killing_the_parent(box):
    parent_before = os.getpid()
    targets = "[os.getppid(), 1, -1]"  # -1: every process it may signal (its own PID namespace)
    code = f"""
import os, signal
for pid in {targets}:
    try:
        os.kill(pid, signal.SIGKILL)
        print("kill", pid, "sent")
    except OSError as exc:
        print("kill", pid, "refused:", exc.strerror)
print("still here")
"""
    response, text = attack(box, code)
    assert os.getpid() == parent_before  # this test process is alive to check
    assert "kill" in text
    # The sandbox keeps serving afterwards.
    again = box.run(RunCodeRequest(code="print('fine')", language="python"))
    assert again.run_result.stdout == "fine\n"
    assert subprocess.run(["true"]).returncode == 0


def test_reading_host_environment_secrets(box):
    code = """
import os
print(sorted(os.environ.items()))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        print(pid, open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
    except OSError as exc:
        print(pid, "environ denied:", exc.strerror)
"""
    response, text = attack(box, code)
    assert "TOOLRL_TEST_SECRET" not in response.run_result.stdout and SECRET not in response.run_result.stdout
    assert "PATH" in text  # the model does see its own (clean) environment
