"""Helpers shared by the sandbox-fusion tests (a uniquely named module: conftest.py is not importable
when several test folders run in one session)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from toolrl_sandbox_fusion.embedded.launch import _probe_bwrap, find_interpreter

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
