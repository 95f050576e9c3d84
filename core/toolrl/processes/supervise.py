"""``toolrl train ... --supervise``: the controller as a child process, started again with ``--resume`` on
the same run directory whenever it dies (docs/recovery.md, "The controller"). The steps after the newest
checkpoint are trained again exactly, their count the restart's ``steps_lost``; the supervisor tells the
new controller what died through :data:`RESTART_ENV`, and it records the restart
(:func:`controller_restart`) in ``recoveries.jsonl`` and its first step's row.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolrl.run_dir import RunDir, latest

log = logging.getLogger(__name__)

RESTART_ENV = "TOOLRL_CONTROLLER_RESTART"
CONFIG_ERROR = 2  # the CLI's exit status for a bad config: starting again would fail again


def controller_restart(start: int, lost: int) -> list[dict[str, Any]]:
    """The restart this controller is (a row for ``recoveries.jsonl``), when a supervisor started it
    in place of one that died; ``start``: the checkpoint's step, ``lost``: trained steps after it."""
    note = os.environ.pop(RESTART_ENV, None)
    if not note:
        return []
    died = json.loads(note)
    return [{"what": "controller", "died": died["died"], "during": died.get("during", ""), "mode": "restart",
             "source": f"checkpoint (step {start})" if start else "initial weights", "time": died["time"],
             "recovery_s": time.time() - died["time"], "steps_lost": lost}]


def supervise(args: Sequence[str], output_dir: Path, max_restarts: int) -> int:
    """Run ``toolrl train ARGS`` (without ``--supervise``) until it finishes, restarting it after each
    death; the exit status of the last run."""
    argv = list(args)
    restarts = 0
    env = dict(os.environ)
    while True:
        child = subprocess.Popen([sys.executable, "-m", "toolrl", "train", *argv], env=env, start_new_session=True)
        code = _wait(child)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # what it started (Ray's processes, tools) goes with it
        if code in (0, CONFIG_ERROR) or restarts >= max_restarts:
            if code not in (0, CONFIG_ERROR):
                log.error("controller (pid %d) died (%s); %d restart(s) used, giving up", child.pid, _how(code),
                          restarts)
            return code if code >= 0 else 128 - code
        restarts += 1
        checkpoint = latest(output_dir / RunDir.CHECKPOINTS)
        argv = [a for a in argv if a not in ("--resume", "--overwrite")] + \
            ["--resume" if checkpoint is not None else "--overwrite"]
        step = checkpoint.name if checkpoint is not None else "the start"
        log.warning("controller (pid %d) died (%s): restarting it from %s (restart %d of %d)", child.pid,
                    _how(code), step, restarts, max_restarts)
        env[RESTART_ENV] = json.dumps({"died": f"controller (pid {child.pid}, {_how(code)})", "time": time.time()})


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The child's exit status. The child runs in its own session (so that all it starts can be
    killed with it), so a Ctrl-C or SIGTERM sent to the supervisor is passed on to it, and the
    supervisor stops once the child has."""
    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        return child.wait()
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGINT)
        child.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit status {code}"
