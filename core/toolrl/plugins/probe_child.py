"""The screening child, started by :mod:`toolrl.plugins.supervisor` (``python -c BOOTSTRAP``, which
reads the request and takes the parent's ``sys.path`` first); not for use by hand.

Given the request (plugin selection, the plugins to skip, the pipe ``fd``), it loads plugins exactly
as the parent will — :class:`toolrl.plugins.Plugins`, then the ``register_commands`` hooks on the
real command group — and writes one JSON line to the pipe when each plugin's import or hook starts
and ends, with the files loaded since the last line. A plugin that changes the process
(:mod:`toolrl.plugins.process_state`), forks it, or raises KeyboardInterrupt ends the child with a line
saying so. It ends with ``os._exit`` so a thread a plugin left behind cannot hold it open. Its last line
lists the parts each distribution provided (the verdict remembers them).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from typing import Any

import click

from toolrl.plugins import Plugins
from toolrl.plugins.process_state import ProcessState
from toolrl.plugins.verdicts import file_state


class Reporter:
    """Writes the child's events; each carries the files of the modules loaded since the last one."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        paths = sysconfig.get_paths()  # the standard library's directories, and site-packages beneath them
        self.stdlib = tuple(os.path.join(paths[k], "") for k in ("stdlib", "platstdlib"))
        self.site = tuple(os.path.join(paths[k], "") for k in ("purelib", "platlib"))
        self.seen = set(sys.modules)
        self.current: tuple[str, str] | None = None  # (plugin, phase) whose code runs now

    def _listed(self, path: str) -> bool:
        """Standard-library files change only with the interpreter: verdicts need not list them."""
        return not path.startswith(self.stdlib) or path.startswith(self.site)

    def send(self, **event: Any) -> None:
        modules = sys.modules.copy()  # a plugin's thread may be importing meanwhile
        files = {}
        for name in modules.keys() - self.seen:
            path = getattr(modules[name], "__file__", None)
            if isinstance(path, str) and self._listed(path) and (state := file_state(path)):
                files[path] = state
        self.seen.update(modules)
        # The pid: a copy of this process that a plugin forked at C level writes here too.
        data = (json.dumps({**event, "files": files, "pid": os.getpid()}) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    @contextlib.contextmanager
    def watch(self, plugin: str, phase: str) -> Iterator[None]:
        """Around one piece of a plugin's code: a change to the process, or a Ctrl-C it raises (which the
        loader lets through), ends the child naming the plugin; the parent goes on without it."""
        before = ProcessState.take()
        self.send(start=plugin, phase=phase)
        self.current = (plugin, phase)
        try:
            yield
        except KeyboardInterrupt:
            self.fail(plugin, phase, "raised KeyboardInterrupt")
        self.current = None
        if (limit := sys.getrecursionlimit()) != before.recursion_limit:  # first: a low one breaks the rest
            self.fail(plugin, phase, f"set the recursion limit to {limit}")
        changes = ProcessState.take().changes_since(before)
        if changes:
            self.fail(plugin, phase, "; ".join(changes))
        self.send(end=plugin)

    def forked(self) -> None:
        """In the copy a plugin's ``os.fork()`` made (an at-fork hook): a copy of the process would
        outlive every command that loads the plugin, so this one names it and ends at once."""
        plugin, phase = self.current or ("?", "?")
        self.fail(plugin, phase, "forked the process (its copy would outlive every command)")

    def fail(self, plugin: str, phase: str, why: str) -> None:
        self.send(failed=plugin, phase=phase, why=why)
        os._exit(3)


def main(request: dict[str, Any]) -> None:
    # Standard modules that register exit handlers when first imported: imported now, so that a plugin
    # importing them is not taken for one that registers its own (toolrl.plugins.process_state).
    import logging  # noqa: F401
    import multiprocessing.util  # noqa: F401

    reporter = Reporter(request["fd"])
    os.register_at_fork(after_in_child=reporter.forked)
    plugins = Plugins(env=request["env"], strict=False, screened=request["skip"], watch=reporter.watch)
    # A group of its own: the plugin's register_commands runs as it would on the real CLI, and the
    # plugins layer never imports the CLI above it.
    plugins.add_commands(click.Group("toolrl"))
    reporter.send(done=True, provided=plugins.provided())
    os._exit(0)

