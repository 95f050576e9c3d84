"""Child processes that exit when their stdin closes (toolrl.children): stopping one."""

from __future__ import annotations

import signal
import subprocess
import sys

from toolrl.children import stop_child


def test_stop_child_closes_stdin_and_kills_a_child_that_stays() -> None:
    """A child that exits at its stdin's end exits by itself; one that ignores it is killed after the
    grace period; one that has exited is left as it is."""
    polite = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    stop_child(polite, grace_s=60)
    assert polite.returncode == 0
    stubborn = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    stop_child(stubborn, grace_s=0.2)
    assert stubborn.returncode == -signal.SIGKILL
    stop_child(stubborn)
