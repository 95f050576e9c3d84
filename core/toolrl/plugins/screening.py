"""Plugin screening: external plugins' code runs first in a supervised child process.

The in-process error boundary catches any exception a plugin raises, but not a plugin that ends the
process (``os._exit``, a segfault, being killed) or never returns (it sleeps, waits on a network).
So before the loader imports external plugins, :func:`screen` has a child interpreter
(:mod:`toolrl.plugins.probe_child`) run the very same loading — each import and each registration
hook, in the same order — reporting over a pipe when each piece of plugin code starts and ends. A
plugin whose code ends the child, or runs past the time limit (``TOOLRL_PLUGIN_IMPORT_TIMEOUT_S``,
default 5 s, for each import or hook call), gets an error naming it; a fresh child goes on without it,
and the parent skips it. The verdict is cached (:mod:`toolrl.plugins.verdicts`), so this costs one
child per change of the installed plugins, not one per command.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import toolrl.plugins.verdicts as verdicts

TIMEOUT_ENV = "TOOLRL_PLUGIN_IMPORT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 5.0
# Time allowed outside any plugin's code: the child's start-up and the core's work between plugins.
CORE_LIMIT_S = 60.0
# The settings that choose which plugins load; the child gets the parent's values.
SELECTION_ENV = ("TOOLRL_LOAD_PLUGINS", "TOOLRL_DISABLE_PLUGINS")
KEY_FORMAT = 1


@dataclass(frozen=True)
class Entry:
    """An entry point about to load: its plugin name, module, and what identifies its distribution."""

    name: str
    module: str
    identity: tuple[str, ...]  # entry-point value, distribution name, version, location


def screen(entries: list[Entry], env: Mapping[str, str], timeout_s: float) -> dict[str, str]:
    """Plugin name -> why it must not load in this process, for ``entries`` (in loading order)."""
    if not entries:
        return {}
    key: list[Any] = [KEY_FORMAT, [[e.name, *e.identity] for e in entries]]
    cache = verdicts.cache_file(env)
    cached = verdicts.lookup(cache, key, timeout_s)
    if cached is not None:
        return cached
    verdict, complete = _probe(entries, env, timeout_s)
    if complete:
        verdicts.store(cache, key, verdict)
    # Incomplete: a child failed outside any plugin's code (not a plugin's doing, or not one we can
    # name). What was found still holds; the rest load unscreened, as before, and nothing is cached.
    return verdict.failures


def _probe(entries: list[Entry], env: Mapping[str, str], timeout_s: float) -> tuple[verdicts.Verdict, bool]:
    modules = {e.name: e.module for e in entries}
    verdict = verdicts.Verdict(failures={}, files={}, timeout_s=timeout_s, timed_out=False)
    while True:  # each round either ends or fails one more plugin, so this ends
        outcome = _run_child(env, verdict.failures, timeout_s, verdict.files)
        if outcome is None or outcome is True:
            return verdict, outcome is True
        name, message, timeout = outcome
        if name in verdict.failures or name not in modules:  # not a plugin the child was asked to load
            return verdict, False
        verdict.failures[name] = message
        verdict.timed_out = verdict.timed_out or timeout
        verdict.files.update(_module_files(modules[name]))


def _run_child(env: Mapping[str, str], skip: dict[str, str], timeout_s: float,
               files: dict[str, list[int]]) -> tuple[str, str, bool] | bool | None:
    """One child run: True when it finished, (plugin, message, timed out) when a plugin ended or hung it,
    None when it failed outside any plugin's code."""
    import subprocess

    read_fd, write_fd = os.pipe()
    path = [str(p) for p in sys.path if isinstance(p, str | os.PathLike)]
    request = {"path": path, "env": {k: env[k] for k in SELECTION_ENV if k in env}, "skip": skip,
               "fd": write_fd}
    core_root = str(Path(__file__).resolve().parents[2])  # this toolrl, whatever the child's sys.path
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [core_root,
                                                                          os.environ.get("PYTHONPATH")]))}
    try:
        child = subprocess.Popen([sys.executable, "-m", "toolrl.plugins.probe_child"], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_fd,),
                                 env=child_env)
    except OSError:
        os.close(read_fd)
        return None
    finally:
        os.close(write_fd)
    try:
        try:
            child.stdin.write(json.dumps(request).encode())  # type: ignore[union-attr]
            child.stdin.close()  # type: ignore[union-attr]
        except OSError:  # the child is already gone: its exit status tells why
            pass
        return _supervise(child, read_fd, timeout_s, files)
    finally:
        os.close(read_fd)
        if child.poll() is None:
            child.kill()
        child.wait()


def _supervise(child: Any, fd: int, timeout_s: float,
               files: dict[str, list[int]]) -> tuple[str, str, bool] | bool | None:
    events = _Events(fd, child)
    current: tuple[str, str] | None = None  # (plugin, phase) whose code is running in the child
    while True:
        event = events.next(timeout_s if current else CORE_LIMIT_S)
        if event == "timeout" or event == "eof":
            if current is None:
                return None
            plugin, phase = current
            if event == "timeout":
                return plugin, f"{phase} took longer than {timeout_s:g} s ({TIMEOUT_ENV}); not loaded", True
            return plugin, f"{_ending(child.wait())} during {phase}; not loaded", False
        assert isinstance(event, dict)
        files.update(event.get("files", {}))
        if event.get("done"):
            return True
        current = (event["start"], event["phase"]) if "start" in event else None


def _ending(code: int) -> str:
    if code >= 0:
        return f"exited with status {code}"
    import signal

    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class _Events:
    """JSON lines from the child's pipe, each awaited with a time limit."""

    def __init__(self, fd: int, child: Any) -> None:
        self.fd, self.child, self.buffer = fd, child, b""

    def next(self, limit_s: float) -> dict[str, Any] | str:
        import select

        deadline = time.monotonic() + limit_s
        while True:
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                # Short waits, so a child that died while a process it started holds the pipe open is seen.
                if not select.select([self.fd], [], [], min(remaining, 0.2))[0]:
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


def _module_files(module: str) -> dict[str, list[int]]:
    """The files of an entry module and its packages, found without running any of them: a plugin that
    ended or hung the child cannot report what it loaded, but editing its entry module screens again."""
    import importlib.machinery
    import importlib.util

    files: dict[str, list[int]] = {}
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: no module code runs
        for depth in range(1, len(parts) + 1):
            if spec is None:
                break
            if spec.has_location and spec.origin and (state := verdicts.file_state(spec.origin)):
                files[spec.origin] = state
            if depth < len(parts):
                spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]),
                                                                spec.submodule_search_locations)
    except (ImportError, ValueError):
        pass
    return files
