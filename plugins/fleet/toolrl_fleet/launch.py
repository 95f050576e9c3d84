"""Environment servers the ``fleet`` session kind starts itself: ``toolrl env serve`` subprocesses on free
loopback ports. One that dies is started again on its port (its address stays the fleet's). Each child
exits when its stdin closes, so it never outlives the process that started it (a normal exit, a crash
or SIGKILL all close the pipe)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from typing import Any

from toolrl.plugin_support import stop_child


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalServer:
    """One ``toolrl env serve NAME`` process of this client's."""

    def __init__(self, served: str, options: dict[str, Any], capacity: int, host: str = "127.0.0.1") -> None:
        self.served, self.options, self.capacity, self.host = served, options, capacity, host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (a file, not a pipe: a chatty server never blocks)
        self.starts = 0

    def spawn(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolrl", "env", "serve", self.served, "--host", self.host, "--port", str(self.port),
             "--capacity", str(self.capacity), "--options", json.dumps(self.options), "--until-stdin-closes"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart_if_dead(self) -> None:
        """Start it again when its process has exited."""
        if self.process is not None and not self.alive():
            self.spawn()

    def error_tail(self) -> str:
        self.log.seek(0)
        return " | ".join(self.log.read().decode(errors="replace").strip().splitlines()[-3:]) or "no output"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_child(process)
        self.log.close()
