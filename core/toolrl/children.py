"""Child processes that exit when their stdin closes (plugins' servers: they never outlive the process
that started them, since its exit, crash or SIGKILL closes the pipe), and stopping one."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_child(process: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """Stop ``process``, a child that exits when its stdin closes (started with ``stdin=PIPE``): close
    the pipe, wait ``grace_s`` seconds for it to exit, then kill it. A child that has exited is left."""
    if process.poll() is not None:
        return
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
