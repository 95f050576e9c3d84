"""The verdict cache of plugin screening (:mod:`toolrl.plugins.screening`).

A verdict says which plugins must not load in-process (they killed or hung the screening child) and
lists every file the child loaded, each with its modification time and size; it holds while the entry
points about to load and those files are unchanged (what that key holds and what screens again:
docs/plugins.md, "Loading, attribution and failures").

A record also keeps the parts each screened distribution provided (:func:`providers`): after the
distribution is removed, a config naming one of its parts is told which distribution is missing.

The file is only a cache: unreadable or corrupt, it is a miss; unwritable, each command screens again.
Writes replace the file atomically, so concurrent processes never read half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from toolrl.cache import cache_root

FILE_NAME = "plugin-verdicts.json"
FORMAT = 1
KEEP = 16  # records kept, newest first (environments and plugin selections a user switches between)


class Verdict(NamedTuple):  # not a dataclass: creating one costs a millisecond of every command's start-up
    failures: dict[str, str]  # plugin name -> why it was not loaded
    files: dict[str, list[int]]  # path -> [mtime_ns, size] when the child loaded it
    timeout_s: float
    timed_out: bool
    provided: dict[str, dict[str, list[str]]] = {}  # distribution -> kind -> part names and aliases


def cache_file(env: Mapping[str, str]) -> Path:
    return cache_root(env) / FILE_NAME


def file_state(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _records(file: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
        return []
    return [r for r in data["records"] if isinstance(r, dict)]


def _holds(record: dict[str, Any], timeout_s: float) -> bool:
    if record["timed_out"] and record["timeout_s"] != timeout_s:
        return False
    return all(file_state(path) == state for path, state in record["files"].items())


def lookup(file: Path, key: list[Any], timeout_s: float) -> dict[str, str] | None:
    """The cached failures for ``key``, or None when there is no verdict that still holds."""
    record = next((r for r in _records(file) if r.get("key") == key), None)
    try:
        return dict(record["failures"]) if record is not None and _holds(record, timeout_s) else None
    except (KeyError, TypeError, AttributeError, ValueError):  # a damaged record is a miss
        return None


def store(file: Path, key: list[Any], verdict: Verdict) -> None:
    record = {"key": key, "failures": verdict.failures, "files": verdict.files,
              "timeout_s": verdict.timeout_s, "timed_out": verdict.timed_out, "provided": verdict.provided}
    records = [record] + [r for r in _records(file) if r.get("key") != key][: KEEP - 1]
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": FORMAT, "records": records}), encoding="utf-8")
        os.replace(tmp, file)
    except OSError:  # a read-only cache costs a screening per command, nothing else
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def providers(file: Path, kind: str, name: str) -> list[str]:
    """The distributions that provided the part ``name`` (or an alias) of ``kind`` when they were
    screened, newest record first."""
    found: list[str] = []
    for record in _records(file):
        provided = record.get("provided")
        for dist, kinds in (provided.items() if isinstance(provided, dict) else ()):
            names = kinds.get(kind) if isinstance(kinds, dict) else None
            if isinstance(names, list) and name in names and dist not in found:
                found.append(dist)
    return found
