"""Ctrl-C during `toolrl train` ends with one line naming the command that continues the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ctrl_c_ends_with_one_line_naming_resume(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "toolrl", "train", str(ROOT / "examples" / "tiny.yaml"), "trainer.total_steps=50",
            "trainer.save_every=1", f"trainer.output_dir={out}"]
    # Ctrl-C as in a terminal: a parallel test runner (nox --parallel) may start us with SIGINT ignored,
    # which a child inherits, and a Python started so never raises KeyboardInterrupt.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("step 1:"):
                break
        # The tiny random model never answers right: every group's rewards are equal, and the line says so.
        assert lines and lines[-1].endswith("(all 2 groups had equal rewards: zero advantage, nothing learned)"), lines[-5:]
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "step_000001" / "meta.json").exists():
            assert time.monotonic() < deadline, "no checkpoint after step 1"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground process group
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    last = [ln for ln in rest.splitlines() if ln.strip()][-1]
    assert last.startswith("interrupted: toolrl train ") and last.endswith(" --resume continues from step_00000" + last[-1])
    assert f"trainer.output_dir={out}" in last and "Traceback" not in rest
