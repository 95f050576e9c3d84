"""The parent's side of a screening child (:mod:`toolrl.plugins.probe_child`): start it, feed it the
request, read its events with a time limit for each plugin's code, and kill it when that runs out.

Imported only when the verdict cache misses (:mod:`toolrl.plugins.screening`), so a warm
``toolrl list-plugins`` never loads ``subprocess`` or this module.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.plugins.verdicts import file_state

# Time allowed outside any plugin's code: the child's start-up and the core's work between plugins.
CORE_LIMIT_S = 60.0
# The child takes the parent's sys.path before importing anything of toolrl's or a plugin's.
BOOTSTRAP = ("import json, sys; request = json.loads(sys.stdin.readline()); sys.path[:] = request['path']; "
             "from toolrl.plugins.probe_child import main; main(request)")


@dataclass(frozen=True)
class Stopped:
    """A plugin's code ended the child (``code``: its exit status, negative for a signal), ran past
    the time limit (``code`` None), or did what the child refuses (``why``: it changed the process)
    during ``phase`` (``import``, ``registration``, a hook's name)."""

    plugin: str
    phase: str
    code: int | None
    why: str | None = None


@dataclass
class Found:
    """What the child runs reported: every file loaded, and the parts each distribution provided."""

    files: dict[str, list[int]]
    provided: dict[str, dict[str, list[str]]]


def run_child(selection: Mapping[str, str], skip: Mapping[str, str], timeout_s: float,
              found: Found, marker_env: str) -> Stopped | bool:
    """One child run, loading what ``selection`` (the plugin-selection variables) allows, less ``skip``.
    True when it finished; a :class:`Stopped` when a plugin ended or hung it; False when it failed
    outside any plugin's code. ``found`` gains what the child reported. ``marker_env``: the variable
    that tells the child it is one (:data:`toolrl.plugins.screening.CHILD_ENV`)."""
    read_fd, write_fd = os.pipe()
    path = [str(p) for p in sys.path if isinstance(p, str | os.PathLike)]
    request = {"path": path, "env": dict(selection), "skip": dict(skip), "fd": write_fd}
    # In the environment every process the child starts inherits (forked or spawned, in its session or
    # not): afterwards, whatever carries this marker is killed.
    marker = secrets.token_hex(8)
    try:
        # A session of its own: whatever the plugins start is killed with the child.
        # Files, not /dev/null: the child measures what each plugin prints.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            child = subprocess.Popen([sys.executable, "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=out,
                                     stderr=err, pass_fds=(write_fd,), start_new_session=True,
                                     env={**os.environ, marker_env: marker})
    except OSError:
        os.close(read_fd)
        return False
    finally:
        os.close(write_fd)
    try:
        with contextlib.suppress(OSError):  # the child is already gone: its exit status tells why
            child.stdin.write(json.dumps(request).encode() + b"\n")  # type: ignore[union-attr]
            child.stdin.close()  # type: ignore[union-attr]
        return _supervise(child, read_fd, timeout_s, found)
    finally:
        os.close(read_fd)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # none left: all ended already
            os.killpg(child.pid, signal.SIGKILL)
        child.kill()
        child.wait()
        kill_marked(f"{marker_env}={marker}".encode())  # what left the session


def kill_marked(entry: bytes) -> None:
    """Kill every process of ours whose environment holds ``entry`` (``NAME=value``), found in Linux's
    /proc (elsewhere none are)."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):  # another user's, or already gone
            if entry in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)


def _supervise(child: Any, fd: int, timeout_s: float, found: Found) -> Stopped | bool:
    events = _Events(fd, child)
    current: tuple[str, str] | None = None  # (plugin, phase) whose code is running in the child
    while True:
        event = events.next(timeout_s if current else CORE_LIMIT_S)
        if event == "eof":  # the child ended, or just closed the pipe: it gets what time remains
            try:
                code: int | None = child.wait(timeout=events.remaining)
            except subprocess.TimeoutExpired:
                code = None
            return Stopped(*current, code) if current else False
        if event == "timeout":
            return Stopped(*current, None) if current else False
        assert isinstance(event, dict)
        found.files.update(event.get("files", {}))
        if event.get("pid", child.pid) != child.pid and "failed" not in event:  # a copy forked at C level
            named = current or (str(event.get("start") or event.get("end") or "?"), "?")
            return Stopped(*named, None, "forked the process (its copy would outlive every command)")
        if event.get("done"):
            found.provided.update(event.get("provided", {}))
            return True
        if "failed" in event:
            return Stopped(str(event["failed"]), str(event.get("phase", "?")), None, str(event.get("why", "?")))
        current = (event["start"], event["phase"]) if "start" in event else None


class _Events:
    """JSON lines from the child's pipe, each awaited with a time limit."""

    def __init__(self, fd: int, child: Any) -> None:
        self.fd, self.child, self.buffer = fd, child, b""
        self.deadline = time.monotonic()

    @property
    def remaining(self) -> float:
        """Seconds left of the current wait."""
        return max(self.deadline - time.monotonic(), 0.0)

    def next(self, limit_s: float) -> dict[str, Any] | str:
        self.deadline = time.monotonic() + limit_s
        while True:
            while b"\n" not in self.buffer:
                if self.remaining <= 0:
                    return "timeout"
                # Short waits, so a child that died while a process it started holds the pipe open is seen.
                if not select.select([self.fd], [], [], min(self.remaining, 0.2))[0]:
                    if self.child.poll() is not None:
                        return "eof"
                    continue
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return "eof"
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                event = json.loads(line)
            except ValueError:  # not ours: only the child's reporter writes here
                continue
            if isinstance(event, dict):
                return event


def module_files(module: str) -> dict[str, list[int]]:
    """The files of an entry module and its packages, found without running any of them: a plugin that
    ended or hung the child cannot report what it loaded, but editing its entry module screens again."""
    files: dict[str, list[int]] = {}
    parts = module.split(".")
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(parts[0])  # a top-level name: no module code runs
        for depth in range(1, len(parts) + 1):
            if spec is None:
                break
            if spec.has_location and spec.origin and (state := file_state(spec.origin)):
                files[spec.origin] = state
            if depth < len(parts):
                spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]),
                                                                spec.submodule_search_locations)
    return files
