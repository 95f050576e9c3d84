"""How a sandbox process is started: the isolation mode, its limits, and the command line.

``bwrap`` (bubblewrap, ``apt-get install -y bubblewrap``) is the default when installed: new user,
PID, network, IPC and UTS namespaces; only ``/usr`` visible (read-only); size-capped tmpfs for the
working folder, ``/tmp`` and ``/dev/shm``; the rest of the root read-only; an empty environment;
uid 65534. When started as root, bubblewrap itself runs as uid 65534 (via ``setpriv``) because the
kernel never applies RLIMIT_NPROC to root, and the process limit is what stops fork bombs.

``unshare`` is the weaker fallback without bubblewrap (the bootstrap isolates itself): network,
mount, IPC and UTS namespaces; every host mount read-only; size-capped tmpfs on ``/tmp`` (the
working folder) and ``/dev/shm``; uid 65534 when run as root, else the caller's uid with every
capability dropped. It does NOT hide world-readable host files, has no PID namespace (a process that
calls ``setsid`` can outlive the run's process-group kill, still bound by its CPU limit), and as a
non-root caller the code runs with the caller's file permissions.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

IsolationMode = Literal["bwrap", "unshare"]
NOBODY = 65534
BOOTSTRAP = (Path(__file__).with_name("bootstrap.py")).read_text()
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. Memory, CPU and file-size limits are rlimits set inside the sandbox after the
    request arrives; the tmpfs sizes are fixed when the process is started."""

    default_memory_mb: int = 1024  # when a request says -1 (SandboxFusion's "no limit")
    max_memory_mb: int = 8192  # the most a request may ask for
    max_processes: int = 32  # RLIMIT_NPROC, counted per sandbox (its own user namespace)
    max_file_mb: int = 64  # RLIMIT_FSIZE
    max_open_files: int = 256
    workdir_mb: int = 128  # tmpfs for the working folder
    tmp_mb: int = 64  # tmpfs for /tmp (bwrap mode; the fallback uses the working folder)
    shm_mb: int = 16
    max_output_bytes: int = 1 << 20  # stdout + stderr; beyond it the run is killed
    max_fetch_bytes: int = 16 << 20


def find_interpreter(explicit: str | None = None) -> str:
    """A real interpreter path the sandbox user can run: the system ``/usr/bin/python3`` (visible
    inside bubblewrap, which binds only /usr), else this process's interpreter resolved through
    symlinks (never a shim, which costs ~250 ms per start)."""
    for candidate in (explicit, "/usr/bin/python3", os.path.realpath(sys.executable)):
        if candidate and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    raise RuntimeError("no Python interpreter found for the sandbox")


def _bwrap_prefix(interpreter: str, limits: SandboxLimits) -> list[str]:
    argv = [
        "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.shm_mb << 20), "--tmpfs", "/dev/shm",
        "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
        "--size", str(limits.workdir_mb << 20), "--tmpfs", "/sandbox",
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--chdir", "/sandbox", "--clearenv",
    ]
    for key, value in {**SANDBOX_ENV, "HOME": "/sandbox", "TMPDIR": "/tmp"}.items():
        argv += ["--setenv", key, value]
    prefix = str(Path(interpreter).parent.parent)
    if not interpreter.startswith("/usr/"):  # e.g. a pyenv build: make its prefix visible, read-only
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--cap-drop", "ALL", "--"]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("bubblewrap mode as root needs setpriv (util-linux) to drop to uid 65534")
        # setpriv instead of Popen(user=...): Popen only uses vfork without a uid change, and forking a
        # large trainer process to start each sandbox would stall it.
        argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"] + argv
    return argv


def build_command(mode: IsolationMode, interpreter: str, limits: SandboxLimits, control_fd: int) -> list[str]:
    """The argv that starts one pooled sandbox process (which then waits for its request)."""
    boot = [interpreter, "-I", "-c", BOOTSTRAP, mode, str(control_fd), str(limits.workdir_mb), str(limits.shm_mb)]
    if mode == "bwrap":
        return _bwrap_prefix(interpreter, limits) + boot
    return boot


def sandbox_env(mode: IsolationMode) -> dict[str, str]:
    # bwrap clears and sets the environment itself; the fallback gets only these variables.
    return {} if mode == "bwrap" else {**SANDBOX_ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}


@functools.cache
def _probe_bwrap(interpreter: str) -> str | None:
    """None when bubblewrap can start a sandbox here, else why not (no binary, no user namespaces)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    argv = _bwrap_prefix(interpreter, SandboxLimits()) + [interpreter, "-I", "-S", "-c", "pass"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start: {exc}"
    if proc.returncode != 0:
        return f"bubblewrap failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace').strip()}"
    return None


def choose_mode(requested: Literal["auto", "bwrap", "unshare"], interpreter: str) -> IsolationMode:
    if requested == "unshare":
        return "unshare"
    problem = _probe_bwrap(interpreter)
    if problem is None:
        return "bwrap"
    if requested == "bwrap":
        raise RuntimeError(f"isolation 'bwrap' requested but {problem}")
    logger.warning(
        "code sandbox: %s; using the weaker 'unshare' fallback (host files readable by uid %s stay "
        "visible, no PID namespace). Install bubblewrap for full isolation.",
        problem, NOBODY if os.geteuid() == 0 else os.getuid(),
    )
    return "unshare"
