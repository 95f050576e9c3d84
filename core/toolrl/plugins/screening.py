"""Plugin screening: external plugins' code runs first in a supervised child process.

The in-process error boundary catches any exception a plugin raises, but not a plugin that ends the
process (``os._exit``, a segfault, being killed) or never returns (it sleeps, waits on a network).
So before the loader imports external plugins, :func:`screen` has a child interpreter
(:mod:`toolrl.plugins.probe_child`, run by :mod:`toolrl.plugins.supervisor`) do the very same
loading — each import and each registration hook, in the same order — reporting when each plugin's
code starts and ends. A plugin whose code ends the child, or runs past the time limit
(``TOOLRL_PLUGIN_IMPORT_TIMEOUT_S``, default 5 s, for each import or hook call), gets an error naming
it; a fresh child goes on without it, and the parent skips it. The verdict is cached
(:mod:`toolrl.plugins.verdicts`), so this costs one child per change of the installed plugins, not
one per command.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import toolrl.plugins.verdicts as verdicts

TIMEOUT_ENV = "TOOLRL_PLUGIN_IMPORT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 5.0
# The settings that choose which plugins load; the child gets the parent's values.
SELECTION_ENV = ("TOOLRL_LOAD_PLUGINS", "TOOLRL_DISABLE_PLUGINS")
KEY_FORMAT = 1
# In a screening child's environment (set by :mod:`toolrl.plugins.probe_child`): loading plugins there —
# a plugin calling get_plugins() at import — must not screen again, or every child would start another.
CHILD_ENV = "TOOLRL_PLUGIN_SCREENING_CHILD"


class Entry(NamedTuple):  # not a dataclass: creating one costs a millisecond of every command's start-up
    """An entry point about to load: its plugin name, module, and what identifies its distribution."""

    name: str
    module: str
    identity: tuple[str, ...]  # entry-point value, distribution name, version, location


def screen(entries: list[Entry], env: Mapping[str, str], timeout_s: float) -> dict[str, str]:
    """Plugin name -> why it must not load in this process, for ``entries`` (in loading order)."""
    if not entries or os.environ.get(CHILD_ENV):  # a screening child is itself supervised
        return {}
    key: list[Any] = [KEY_FORMAT, [[e.name, *e.identity] for e in entries]]
    cache = verdicts.cache_file(env)
    cached = verdicts.lookup(cache, key, timeout_s)
    if cached is not None:
        return cached
    verdict, complete = _probe(entries, {k: env[k] for k in SELECTION_ENV if k in env}, timeout_s)
    if complete:
        verdicts.store(cache, key, verdict)
    # Incomplete: a child failed outside any plugin's code (not a plugin's doing, or not one we can
    # name). What was found still holds; the rest load unscreened, as before, and nothing is cached.
    return verdict.failures


def _probe(entries: list[Entry], selection: Mapping[str, str],
           timeout_s: float) -> tuple[verdicts.Verdict, bool]:
    from toolrl.plugins.supervisor import Found, module_files, run_child

    modules = {e.name: e.module for e in entries}
    failures: dict[str, str] = {}
    found = Found({}, {})
    timed_out = False
    while True:  # each round either ends or fails one more plugin, so this ends
        outcome = run_child(selection, failures, timeout_s, found, CHILD_ENV)
        if isinstance(outcome, bool) or outcome.plugin in failures or outcome.plugin not in modules:
            # finished, failed outside any plugin's code, or stopped in a plugin it was not to load
            return verdicts.Verdict(failures, found.files, timeout_s, timed_out, found.provided), outcome is True
        if outcome.why is not None:
            failures[outcome.plugin] = f"{outcome.why} during {outcome.phase}; not loaded"
        elif outcome.code is None:
            failures[outcome.plugin] = f"{outcome.phase} took longer than {timeout_s:g} s ({TIMEOUT_ENV}); not loaded"
            timed_out = True
        else:
            failures[outcome.plugin] = f"{_ending(outcome.code)} during {outcome.phase}; not loaded"
        found.files.update(module_files(modules[outcome.plugin]))


def _ending(code: int) -> str:
    if code >= 0:
        return f"exited with status {code}"
    import signal

    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"
