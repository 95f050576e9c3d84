"""What a plugin may not change in the process that loads it, taken before and after each piece of its
code in the screening child (:mod:`toolrl.plugins.probe_child`): the standard streams, the working
directory, ``sys.path``, the recursion limit, signal handlers, exit handlers, threads and child
processes it leaves running, what it prints to stdout, and toolrl's own modules and classes. A plugin
that changes any of them is screened out with the change named, since every command would inherit it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD", "SIGPIPE") if hasattr(signal, n))
# What a plugin may write to stderr while loading (a warning or two); stdout belongs to the command.
STDERR_ALLOWANCE = 64 * 1024


@dataclass
class ProcessState:
    cwd: str
    path: tuple[Any, ...]
    recursion_limit: int
    streams: tuple[int, ...]  # ids of sys.stdin/stdout/stderr and their __ variants
    fds_open: tuple[bool, ...]  # whether descriptors 0, 1, 2 are open, and sys.stdout/stderr are
    written: tuple[int, int]  # bytes in the child's stdout and stderr files
    handlers: tuple[Any, ...]
    exit_handlers: int
    threads: frozenset[int]  # non-daemon threads alive
    children: frozenset[int]
    toolrl: dict[str, int] = field(repr=False)  # "module.attr" and "module.Class.attr" -> id of the value

    @classmethod
    def take(cls) -> ProcessState:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a stream a plugin closed or replaced: seen below
                stream.flush()
        return cls(os.getcwd(), tuple(sys.path), sys.getrecursionlimit(),
                   tuple(id(s) for s in (sys.stdin, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)),
                   (*(_is_open(fd) for fd in (0, 1, 2)), *(not getattr(s, "closed", True) for s in (sys.stdout, sys.stderr))),
                   (_size(1), _size(2)),
                   tuple(signal.getsignal(s) for s in _SIGNALS), atexit._ncallbacks(),
                   frozenset(t.ident for t in threading.enumerate() if not t.daemon and t.ident is not None),
                   _children(), _toolrl_objects())

    def changes_since(self, before: ProcessState) -> list[str]:
        """What differs from ``before``, in words (empty: nothing)."""
        changed = []
        if self.cwd != before.cwd:
            changed.append(f"changed the working directory to {self.cwd}")
        if self.path != before.path:
            changed.append("changed sys.path")
        if self.recursion_limit != before.recursion_limit:
            changed.append(f"set the recursion limit to {self.recursion_limit}")
        if self.streams != before.streams or self.fds_open != before.fds_open:
            changed.append("replaced or closed the standard streams")
        if self.written[0] > before.written[0]:
            changed.append(f"printed {self.written[0] - before.written[0]:,} bytes to stdout")
        if self.written[1] - before.written[1] > STDERR_ALLOWANCE:
            changed.append(f"printed {self.written[1] - before.written[1]:,} bytes to stderr")
        if self.handlers != before.handlers:
            changed.append("changed signal handlers")
        if self.exit_handlers != before.exit_handlers:
            changed.append("registered exit handlers (atexit)")
        if self.threads - before.threads:
            changed.append(f"left {len(self.threads - before.threads)} non-daemon thread(s) running")
        if self.children - before.children:
            changed.append(f"left {len(self.children - before.children)} child process(es) running")
        patched = sorted(k for k, v in self.toolrl.items() if before.toolrl.get(k, v) != v)
        if patched:
            changed.append(f"replaced toolrl's own {', '.join(patched[:3])}{' ...' if len(patched) > 3 else ''}")
        return changed


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _size(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return 0


def _children() -> frozenset[int]:
    """This process's children (Linux's /proc; elsewhere none are seen)."""
    found: set[int] = set()
    for tasks in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.update(int(p) for p in tasks.read_text().split())
    return frozenset(found)


def _toolrl_objects() -> dict[str, int]:
    objects: dict[str, int] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "toolrl" or name.startswith("toolrl.")):
            continue
        for attr, value in list(vars(module).items()):
            if attr.startswith("_"):  # module state the core keeps for itself (the loaded plugins, caches)
                continue
            objects[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for member, inner in list(vars(value).items()):
                    if not member.startswith("__"):
                        objects[f"{name}.{attr}.{member}"] = id(inner)
    return objects
