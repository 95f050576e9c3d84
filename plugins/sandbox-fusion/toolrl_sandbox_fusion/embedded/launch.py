"""How a sandbox process is started: the isolation mode, the interpreter, its limits, the command line.

Both modes give the code the same view: a fresh root that is a size-capped tmpfs (the working folder
``/sandbox`` lives on it, and so do files a request places at absolute paths), ``/usr``, the
interpreter's own prefixes and the toolchains (``languages.py``) read-only, ``/lib``-style links as
the host has them, a private ``/proc``, a minimal ``/dev``, size-capped tmpfs on ``/tmp`` and
``/dev/shm``, new PID, network (loopback up), IPC, UTS and mount namespaces, a clean environment,
uid 65534. The bootstrap then furnishes the root alike in both modes (the usual top-level folders, a
minimal ``/etc``, ``/run/toolrl/bin``). Nothing else of the host's filesystem is there.

``bwrap`` (bubblewrap, ``apt-get install -y bubblewrap``) is the default when usable. When started as
root, bubblewrap itself runs as uid 65534 (via ``setpriv``) because the kernel never applies
RLIMIT_NPROC to root, and the process limit is what stops fork bombs; interpreter prefixes that uid
65534 cannot reach (a pyenv build under ``/root``) are first bind-mounted, as root, in a private
mount namespace where bubblewrap can see them.

``unshare`` is the fallback without bubblewrap: the bootstrap builds the same root itself (mount
namespace, ``pivot_root``) and runs the code under a small init process of its own PID namespace.
Remaining differences: RLIMIT_NPROC counts every process of uid 65534 on the host, not per sandbox,
and as non-root the code runs with the caller's uid (in a user namespace, every capability dropped).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolrl_sandbox_fusion.embedded.languages import BIN, Toolchains

logger = logging.getLogger(__name__)

IsolationMode = Literal["bwrap", "unshare"]
NOBODY = 65534
WORKDIR = "/sandbox"
BOOTSTRAP = (Path(__file__).with_name("bootstrap.py")).read_text()
SANDBOX_ENV = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": WORKDIR,
    "PWD": WORKDIR,
    "TMPDIR": "/tmp",
}
# Top-level entries the code may need besides /usr: links into /usr on merged-/usr systems, else
# directories (bound read-only).
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Where the bwrap staging namespace may put prefixes that uid 65534 cannot reach on the host: the
# first existing folder here that holds none of the interpreter's folders.
_STAGES = ("/mnt", "/media", "/srv", "/opt", "/run", "/var/tmp", "/tmp")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. Memory, CPU and file-size limits are rlimits set inside the sandbox after the
    request arrives; the tmpfs sizes are fixed when the process is started."""

    # The most memory any run gets, also one whose request says -1; None: as SandboxFusion, the
    # request's memory_limit_MB decides and -1 (or 0) means no limit.
    max_memory_mb: int | None = None
    max_processes: int = 32  # RLIMIT_NPROC (per sandbox under bubblewrap, its own user namespace)
    max_file_mb: int = 64  # RLIMIT_FSIZE
    max_open_files: int = 256
    workdir_mb: int = 128  # tmpfs for the root, which holds the working folder
    tmp_mb: int = 64  # tmpfs for /tmp
    shm_mb: int = 16
    max_output_bytes: int = 1 << 20  # stdout + stderr; beyond it the run is killed
    max_fetch_bytes: int = 16 << 20


@dataclass(frozen=True)
class Interpreter:
    """The Python the sandbox runs: ``path`` as given (a venv's ``bin/python`` stays a link, so the
    venv is found through its ``pyvenv.cfg``) and the host folders it needs, mounted read-only at the
    same paths (its prefixes outside ``/usr``); its version and whether it has pytest."""

    path: str
    mounts: tuple[str, ...] = ()
    version: str = ""
    has_pytest: bool = False
    has_jupyter: bool = False  # jupyter_client and ipykernel (for /run_jupyter)


def _outside_usr(paths: list[str]) -> tuple[str, ...]:
    """Distinct folders not under /usr (always mounted) nor under one another, shortest first."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths if p}, key=len):
        if path == "/":
            raise RuntimeError("the interpreter's prefix is '/': the whole host would be visible")
        if path == "/usr" or path.startswith("/usr/"):
            continue
        if not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return tuple(kept)


@functools.cache
def _probe(path: str) -> dict:
    """Ask the interpreter where it lives (a venv reports its own prefix and its base's), its version
    and whether it has pytest, jupyter_client and ipykernel."""
    code = ("import json, sys, platform, importlib.util as u; print(json.dumps({'prefixes': [sys.prefix, "
            "sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix], 'version': platform.python_version(), "
            "'pytest': u.find_spec('pytest') is not None, "
            "'jupyter': all(u.find_spec(m) is not None for m in ('jupyter_client', 'ipykernel'))}))")
    try:
        proc = subprocess.run([path, "-I", "-c", code], capture_output=True, text=True, timeout=60, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"python_executable {path!r} cannot be run: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"python_executable {path!r} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def find_interpreter(explicit: str | None = None) -> Interpreter:
    """The sandbox's interpreter. ``explicit``: a Python executable, or a venv/prefix folder (its
    ``bin/python3``). Default: the system ``/usr/bin/python3`` (visible in every sandbox), else this
    process's interpreter resolved through symlinks (never a shim, which costs ~250 ms per start)."""
    if explicit:
        path = os.path.abspath(os.path.expanduser(explicit))
        if os.path.isdir(path):
            candidates = [os.path.join(path, "bin", name) for name in ("python3", "python")]
            path = next((c for c in candidates if os.access(c, os.X_OK)), candidates[0])
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise RuntimeError(f"python_executable {explicit!r}: no executable Python at {path}")
    elif os.access("/usr/bin/python3", os.X_OK):
        path = os.path.realpath("/usr/bin/python3")
    else:
        path = os.path.realpath(sys.executable)
    # Each hop of a symlink chain must resolve inside the sandbox; the prefixes hold the stdlib and
    # site-packages. Folders under /usr are there already.
    hops, hop = [], path
    for _ in range(40):
        hops.append(os.path.dirname(os.path.dirname(hop)))  # bin/.. of each hop
        if not os.path.islink(hop):
            break
        hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
    probe = _probe(path)
    return Interpreter(path, _outside_usr(hops + probe["prefixes"]), probe["version"], probe["pytest"],
                       probe["jupyter"])


def sandbox_env(interpreter: Interpreter) -> dict[str, str]:
    """The code's whole environment. PATH starts with the sandbox's commands (python, pytest, the
    toolchains), then the interpreter's own folder (a venv's scripts), as SandboxFusion's runtime
    environment is first on its PATH."""
    system = ["/usr/local/bin", "/usr/bin", "/bin"]
    own = os.path.dirname(interpreter.path)
    return {"PATH": ":".join([BIN, *([own] if own not in system else []), *system]), **SANDBOX_ENV}


def _mounts(interpreter: Interpreter, toolchains: Toolchains) -> list[tuple[str, str]]:
    """Every read-only mount beyond /usr: (host source, target in the sandbox)."""
    return [(m, m) for m in interpreter.mounts] + list(toolchains.mounts)


def resolve_bwrap() -> str | None:
    """bubblewrap's full path, found on this process's PATH (the sandbox starts with an empty one)."""
    found = shutil.which("bwrap")
    return os.path.realpath(found) if found else None


def _reachable_by_nobody(path: str) -> bool:
    """Whether uid 65534 can reach ``path`` (every parent searchable by others)."""
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        try:
            mode = os.stat(os.path.join(*parts[:i])).st_mode
        except OSError:
            return False
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return False
    return True


def _bwrap_argv(bwrap: str, interpreter: Interpreter, toolchains: Toolchains, limits: SandboxLimits) -> list[str]:
    as_root = os.geteuid() == 0
    mounts = _mounts(interpreter, toolchains)
    staged = [source for source, _ in mounts if as_root and not _reachable_by_nobody(source)]
    argv = [
        bwrap, "--unshare-all", "--die-with-parent", "--new-session",
        # The root is a writable, size-capped tmpfs of its own (SandboxFusion's root is writable
        # too, an overlay); what is bound onto it below stays read-only.
        "--size", str(limits.workdir_mb << 20), "--tmpfs", "/",
        "--ro-bind", "/usr", "/usr",
    ]
    for name in ROOT_LINKS:
        host = "/" + name
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.shm_mb << 20), "--tmpfs", "/dev/shm",
        "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
        "--remount-ro", "/dev", "--dir", WORKDIR,
    ]
    stage = _stage_folder([source for source, _ in mounts]) if staged else ""
    for source, target in mounts:  # after /tmp: a venv may live under it
        argv += ["--ro-bind", f"{stage}/{staged.index(source)}" if source in staged else source, target]
    argv += ["--chdir", WORKDIR, "--clearenv"]
    for key, value in sandbox_env(interpreter).items():
        argv += ["--setenv", key, value]
    argv += ["--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--cap-drop", "ALL", "--"]
    if as_root:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("bubblewrap mode as root needs setpriv (util-linux) to drop to uid 65534")
        # setpriv instead of Popen(user=...): Popen only uses vfork without a uid change, and forking a
        # large trainer process to start each sandbox would stall it.
        argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"] + argv
    if staged:
        argv = _staging_prefix(stage, staged) + argv
    return argv


def _stage_folder(sources: list[str]) -> str:
    for stage in _STAGES:
        if os.path.isdir(stage) and not any(m == stage or m.startswith(stage + "/") for m in sources):
            return stage
    raise RuntimeError(f"no folder to stage the interpreter's folders in (tried {', '.join(_STAGES)})")


def _staging_prefix(stage: str, staged: list[str]) -> list[str]:
    """As root, in a private mount namespace: a tmpfs on ``stage`` holding bind mounts of the
    folders (and files) uid 65534 cannot reach, so bubblewrap (running as 65534) can bind them from there."""
    unshare, sh = shutil.which("unshare"), shutil.which("sh")
    if unshare is None or sh is None:
        raise RuntimeError("mounting an interpreter under a private folder needs unshare (util-linux) and sh")
    script = f"mount -t tmpfs -o mode=0755,size=64k toolrl-stage {stage} || exit 125\n"
    for i in range(len(staged)):
        source, target = f'"${{{i + 1}}}"', f"{stage}/{i}"
        script += (f"{{ if [ -d {source} ]; then mkdir {target}; else : > {target}; fi; }} && "
                   f"mount --bind -o ro {source} {target} || exit 125\n")
    script += f'shift {len(staged)}\nexec "$@"\n'
    return [unshare, "--mount", "--propagation", "private", "--", sh, "-c", script, "stage", *staged]


def build_command(mode: IsolationMode, interpreter: Interpreter, toolchains: Toolchains, limits: SandboxLimits,
                  control_fd: int) -> list[str]:
    """The argv that starts one pooled sandbox process (which then waits for its request). The
    bootstrap gets the mounts (the fallback makes them itself) and the commands to link in BIN."""
    mounts = _mounts(interpreter, toolchains)
    boot = [interpreter.path, "-I", "-c", BOOTSTRAP, mode, str(control_fd), str(limits.workdir_mb),
            str(limits.tmp_mb), str(limits.shm_mb), str(len(mounts)), *(p for m in mounts for p in m),
            *(f"{name}={target}" for name, target in toolchains.commands)]
    if mode == "bwrap":
        bwrap = resolve_bwrap()
        if bwrap is None:
            raise RuntimeError("bubblewrap is not installed (apt-get install -y bubblewrap)")
        return _bwrap_argv(bwrap, interpreter, toolchains, limits) + boot
    return boot


def popen_env(mode: IsolationMode, interpreter: Interpreter) -> dict[str, str]:
    # bwrap clears and sets the environment itself; the fallback gets only these variables.
    return {} if mode == "bwrap" else sandbox_env(interpreter)


@functools.cache
def _probe_bwrap(interpreter: Interpreter) -> str | None:
    """None when bubblewrap can start a sandbox here, else why not (no binary, no user namespaces)."""
    bwrap = resolve_bwrap()
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    try:
        argv = _bwrap_argv(bwrap, interpreter, Toolchains(), SandboxLimits()) + [interpreter.path, "-I", "-S", "-c", "pass"]
        proc = subprocess.run(argv, capture_output=True, timeout=30, env={})
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start: {exc}"
    if proc.returncode != 0:
        return f"bubblewrap failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace').strip()}"
    return None


def choose_mode(requested: Literal["auto", "bwrap", "unshare"], interpreter: Interpreter) -> IsolationMode:
    if requested == "unshare":
        return "unshare"
    problem = _probe_bwrap(interpreter)
    if problem is None:
        return "bwrap"
    if requested == "bwrap":
        raise RuntimeError(f"isolation 'bwrap' requested but {problem}")
    logger.warning(
        "code sandbox: %s; using the 'unshare' fallback (same filesystem view; RLIMIT_NPROC is shared "
        "by every process of uid %s). Install bubblewrap for per-sandbox process limits.",
        problem, NOBODY if os.geteuid() == 0 else os.getuid(),
    )
    return "unshare"
