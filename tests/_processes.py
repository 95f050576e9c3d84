"""Killing a training run mid-way, as a crash would: the one way the resume tests do it."""

import signal
import subprocess
import time
from pathlib import Path


def kill_after_checkpoint(args: list[str], env: dict[str, str], checkpoint: Path, timeout: float = 300) -> None:
    """Start ``args``, wait until ``checkpoint``'s ``meta.json`` exists (the checkpoint is complete),
    then SIGKILL the process: no handler runs, nothing is flushed or closed."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not (checkpoint / "meta.json").exists():
            assert proc.poll() is None, proc.stderr.read()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
