"""Helpers shared by the sandbox-fusion tests (a uniquely named module: conftest.py is not importable
when several test folders run in one session)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from toolrl_sandbox_fusion.embedded.launch import _probe_bwrap, find_interpreter
from toolrl_sandbox_fusion.embedded.pool import SandboxProcess

HAVE_BWRAP = shutil.which("bwrap") is not None and _probe_bwrap(find_interpreter()) is None
IS_ROOT = os.geteuid() == 0

requires_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap unusable here (apt-get install -y bubblewrap)")


class ServerProcess:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url


def start_server(*extra: str) -> ServerProcess:
    """``toolrl sandbox serve`` in a subprocess on a free loopback port (port 0, printed back)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrl", "sandbox", "serve", "--host", "127.0.0.1", "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the server prints its address once the socket is bound
    if "serving on " not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return ServerProcess(proc, line.split("serving on ")[1].split()[0])


def stop_server(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def fake_spawn(spawned: list[subprocess.Popen]) -> SandboxProcess:
    """A real, trivial "sandbox" for the pool's tests: its ready byte, then it waits for stdin."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; os.write(int(sys.argv[1]), b'R'); sys.stdin.read()", str(write_fd)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
        start_new_session=True)
    os.close(write_fd)
    spawned.append(proc)
    return SandboxProcess(proc, read_fd)


def serve_apps() -> Iterator[Callable[[Any], str]]:
    """Serve ASGI apps on loopback, each with uvicorn in a thread (``start(app) -> base URL``), all
    stopped when the generator ends: the body of the stand-in servers' fixtures."""
    import uvicorn

    started: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        started.append((server, thread))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(timeout=10)

