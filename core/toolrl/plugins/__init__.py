"""Plugin loading: built-in plugins and entry points, each inside its own error boundary, which holds any
exception but ``KeyboardInterrupt`` (``SystemExit`` included). A plugin that ends the process or never
returns is caught by screening external plugins in a supervised child first (:mod:`toolrl.plugins.screening`).
The environment variables that choose, skip, time and cache plugins: docs/plugins.md, "Loading, attribution
and failures".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal

import pluggy

import toolrl.plugins.verdicts as verdicts
from toolrl import hookspecs
from toolrl.plugins import builtin as builtin_plugins
from toolrl.plugins.registry import (
    KIND_WORDS,
    KINDS,
    Part,
    PartError,
    Registry,
    RegistryError,
    describe_exception,
)
from toolrl.plugins.screening import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, Entry, screen

Status = Literal["ok", "error", "disabled"]
ENTRY_POINT_GROUP = "toolrl"
# Around each piece of a plugin's code the loader runs: (plugin name, phase) -> a context manager.
Watch = Callable[[str, str], contextlib.AbstractContextManager[None]]


class PluginLoadError(RuntimeError):
    """Raised in strict mode when a plugin fails to load or register, and for an invalid plugin setting."""


# A line that opens the toolrl group, well formed or not ("[toolrl", "[ toolrl ]").
_GROUP_HEADER = re.compile(r"^\s*\[\s*" + ENTRY_POINT_GROUP + r"\b", re.MULTILINE)


def toolrl_entry_points() -> tuple[list[metadata.EntryPoint], list[tuple[str, str, str]]]:
    """The ``toolrl`` entry points of the installed distributions (the first of each name on the path,
    as ``importlib.metadata.entry_points`` takes them), and (distribution, version, why) for each whose
    ``entry_points.txt`` is broken where it opens the group: importlib.metadata either raises on such a
    file, for every distribution, or silently drops the group."""
    found: list[metadata.EntryPoint] = []
    malformed: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for dist in metadata.distributions():
        # The name from the dist-info directory's, as importlib.metadata dedups: no METADATA file read.
        key = getattr(dist, "_normalized_name", None) or re.sub(r"[-_.]+", "_", dist.metadata["Name"] or "?").lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            group = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        except Exception as exc:  # a line without "=": the parser raises
            group, problem = [], f"entry_points.txt cannot be read ({describe_exception(exc)})"
        else:
            problem = "entry_points.txt opens the toolrl group with a malformed line; no entry point read"
        if group:
            found += group
        elif _GROUP_HEADER.search(dist.read_text("entry_points.txt") or ""):
            malformed.append((dist.metadata["Name"] or key, dist.version or "?", problem))
    return found, malformed


# How much of one failure a plugin's listing shows.
MAX_ERROR_CHARS = 500


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    builtin: bool = False
    status: Status = "ok"
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    parts: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Its fields, in order: ``toolrl list-plugins --json``'s object."""
        return dataclasses.asdict(self)


def _names(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {v.strip() for v in value.split(",") if v.strip()}


def _timeout(env: Mapping[str, str]) -> float:
    value = env.get(TIMEOUT_ENV, "")
    if not value.strip():
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise PluginLoadError(f"{TIMEOUT_ENV} must be a positive number of seconds, not {value!r}")
    return seconds


def _unwatched(plugin: str, phase: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


class Plugins:
    """The loaded plugins: a pluggy manager, a status per plugin, and the part registry.

    ``screened`` and ``watch`` are for the screening child (:mod:`toolrl.plugins.probe_child`): the
    verdicts found so far, instead of screening again, and a reporter around each plugin's code."""

    def __init__(self, env: Mapping[str, str] | None = None, strict: bool | None = None, *,
                 screened: Mapping[str, str] | None = None, watch: Watch = _unwatched) -> None:
        env = os.environ if env is None else env
        self.env = env
        self.strict = env.get("TOOLRL_STRICT_PLUGINS", "") not in ("", "0") if strict is None else strict
        self.allow = _names(env.get("TOOLRL_LOAD_PLUGINS"))
        self.deny = _names(env.get("TOOLRL_DISABLE_PLUGINS")) or set()
        self.import_timeout_s = _timeout(env)
        self._screened = screened
        self._watch = watch
        self.pm = pluggy.PluginManager("toolrl")
        self.pm.add_hookspecs(hookspecs)
        self.info: dict[str, PluginInfo] = {}
        self.registry = Registry(on_part_error=self._part_failed)
        self._load_builtins()
        self._load_entry_points()
        self._collect_parts()

    # -- loading -------------------------------------------------------------------------------

    def _fail(self, info: PluginInfo, exc: BaseException | str) -> None:
        info.status = "error"
        message = exc if isinstance(exc, str) else describe_exception(exc)
        if len(message) > MAX_ERROR_CHARS:  # a hook's junk (a 100 KB repr) stays readable in a listing
            message = f"{message[:MAX_ERROR_CHARS]}... ({len(message) - MAX_ERROR_CHARS:,} more characters)"
        if info.error is not None and len(info.error) > 2 * MAX_ERROR_CHARS:
            return  # already said enough about this plugin
        info.error = message if info.error is None else f"{info.error}; {message}"
        if self.strict:
            raise PluginLoadError(f"plugin {info.name!r} ({info.distribution}): {message}") from (
                exc if isinstance(exc, BaseException) else None
            )

    def _guarded(self, info: PluginInfo, phase: str, code: Callable[[], Any]) -> tuple[bool, Any]:
        """``code()`` (a piece of ``info``'s code, watched as ``phase``) inside the plugin's error boundary:
        whether it finished, and its value. A broken plugin never breaks the others."""
        try:
            with self._watch(info.name, phase):
                return True, code()
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, PluginLoadError)):  # a user's Ctrl-C, strict mode's error
                raise
            self._fail(info, exc)
            return False, None

    def _register(self, info: PluginInfo, plugin: object) -> None:
        # pluggy reads the plugin's attributes, and refuses invalid hooks and duplicate names
        if self._guarded(info, "registration", lambda: self.pm.register(plugin, name=info.name))[0]:
            info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])

    def _load_builtins(self) -> None:
        version = metadata.version("toolrl")
        for name, plugin in builtin_plugins.BUILTINS.items():
            info = PluginInfo(name=name, distribution="toolrl", version=version, builtin=True)
            self.info[name] = info
            if name in self.deny:
                info.status = "disabled"
                continue
            self._register(info, plugin)

    def _enabled_entry_points(self) -> list[tuple[metadata.EntryPoint, PluginInfo]]:
        """An info for every entry point; the ones to load, in loading order."""
        enabled = []
        entry_points, malformed = toolrl_entry_points()
        for dist_name, version, problem in malformed:
            info = PluginInfo(name=dist_name, distribution=dist_name, version=version)
            self.info[dist_name] = info
            self._fail(info, problem)
        for ep in sorted(entry_points, key=lambda e: e.name):
            dist = ep.dist
            dist_name = dist.name if dist is not None else "?"
            info = PluginInfo(
                name=ep.name, distribution=dist_name, version=dist.version if dist is not None else "?"
            )
            if ep.name in self.info:
                self.info[f"{ep.name} ({dist_name})"] = info
                self._fail(info, f"plugin name {ep.name!r} is already used by {self.info[ep.name].distribution}")
                continue
            self.info[ep.name] = info
            if ep.name in self.deny or dist_name in self.deny or (
                self.allow is not None and dist_name not in self.allow
            ):
                info.status = "disabled"
                continue
            enabled.append((ep, info))
        return enabled

    def _load_entry_points(self) -> None:
        enabled = self._enabled_entry_points()
        failures = self._screened
        if failures is None:
            entries = [Entry(info.name, ep.module, (ep.value, info.distribution, info.version,
                                                    os.path.abspath(ep.dist.locate_file("")) if ep.dist else "?"))
                       for ep, info in enabled]
            failures = screen(entries, self.env, self.import_timeout_s)
        for ep, info in enabled:
            if info.name in failures:  # it ended or hung the screening child: never run here
                self._fail(info, failures[info.name])
                continue
            loaded, plugin = self._guarded(info, "import", ep.load)
            if loaded:
                self._register(info, plugin)

    def _collect_parts(self) -> None:
        for kind in KINDS:
            hook = getattr(self.pm.hook, f"register_{kind}")
            for impl in hook.get_hookimpls():
                info = self.info[self.pm.get_name(impl.plugin)]
                names = info.parts.setdefault(kind, [])

                def register(obj: Any, name: str | None = None, aliases: tuple[str, ...] = (),
                             _info: PluginInfo = info, _kind: str = kind, _names: list = names) -> None:
                    part_name = name or getattr(obj, "name", None)
                    if not part_name or not isinstance(part_name, str):
                        raise ValueError(f"register({obj!r}) needs a name")
                    if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
                        raise ValueError(f"register(..., name={part_name!r}): aliases must be a tuple of names")
                    part = Part(_kind, part_name, _info.name, obj, tuple(aliases))
                    problem = part.precheck()
                    if problem:  # not registered: looking the name up says it is unknown
                        self._fail(_info, problem)
                        return
                    conflict = self.registry.add(part)
                    _names.append(part_name)
                    if conflict:
                        self._fail(_info, conflict)

                self._guarded(info, f"register_{kind}", functools.partial(impl.function, register=register))

    # -- queries -------------------------------------------------------------------------------

    def list(self) -> list[PluginInfo]:
        return sorted(self.info.values(), key=lambda i: (not i.builtin, i.name))

    def load_part(self, kind: str, name: str) -> Any:
        return self.registry.load(kind, name)

    def provided(self) -> dict[str, dict[str, list[str]]]:
        """Distribution -> kind -> the names and aliases its loaded external plugins registered (what
        the screening verdict remembers, for :meth:`removed_provider`)."""
        out: dict[str, dict[str, list[str]]] = {}
        for info in self.info.values():
            if info.builtin or not info.parts:
                continue
            kinds = out.setdefault(info.distribution, {})
            for kind, names in info.parts.items():
                aliases = [a for n in names if self.registry.has(kind, n) for a in self.registry.aliases(kind, n)]
                kinds.setdefault(kind, []).extend([*names, *aliases])
        return out

    def removed_provider(self, kind: str, name: str) -> str:
        """For a name no plugin registers now: "; ..." saying which distribution provided it when
        screened and is gone (or disabled, or broken) now; "" when none is known."""
        for dist in verdicts.providers(verdicts.cache_file(self.env), kind, name):
            here = [i for i in self.info.values() if _dist_key(i.distribution) == _dist_key(dist)]
            if not here:
                return f"; distribution {dist!r} provided it and is not installed (pip install {dist})"
            info = here[0]
            if info.status == "disabled":
                return f"; its plugin {info.name!r} ({dist}) is disabled (TOOLRL_LOAD_PLUGINS/TOOLRL_DISABLE_PLUGINS)"
            if info.status == "error":
                return f"; its plugin {info.name!r} ({dist}) failed to load: {info.error}"
        return ""

    def refused_namesake(self, kind: str, name: str) -> str:
        """For a part of a built-in plugin: "; ..." saying that an outside plugin of the same plugin name
        was refused (a plugin of that name installed before the built-in came), so ``name`` is the
        built-in's part and not what that plugin registers; "" otherwise."""
        try:
            owner = self.registry.get(kind, name).plugin
        except RegistryError:
            return ""
        if not self.info[owner].builtin:
            return ""
        for key, info in self.info.items():
            if info.name == owner and key != owner:
                return (f"; this is the built-in {KIND_WORDS[kind]} {name!r}: plugin {owner!r} ({info.distribution}) "
                        f"was refused ({info.error}): give its entry point another name")
        return ""

    def check(self) -> None:
        """Import and check every registered part (``toolrl list-plugins --check``); a part that fails
        marks its plugin as an error with the reason. Slower than listing: it imports every part."""
        for kind in KINDS:
            for part in self.registry.parts(kind):
                with contextlib.suppress(PartError):  # recorded by _part_failed
                    self.registry.load(kind, part.name)

    def _part_failed(self, part: Part, message: str) -> None:
        """A lazily referenced part failed when loaded: its plugin's status says so from now on
        (once per message; never fatal here, the caller gets the PartError)."""
        info = self.info[part.plugin]
        if message not in (info.error or ""):
            info.status = "error"
            info.error = message if info.error is None else f"{info.error}; {message}"

    def add_commands(self, cli: Any) -> None:
        """Let every plugin add CLI commands, each in its own error boundary."""
        for impl in self.pm.hook.register_commands.get_hookimpls():
            info = self.info[self.pm.get_name(impl.plugin)]
            self._guarded(info, "register_commands", functools.partial(impl.function, cli=cli))


def _dist_key(name: str) -> str:
    """A distribution name as pip compares them (``toolrl_plugin_x`` is ``toolrl-plugin-x``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


_plugins: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugins, loaded on first use."""
    global _plugins
    if _plugins is None:
        _plugins = Plugins()
    return _plugins


def reset_plugins() -> None:
    """Forget the loaded plugins so the next :func:`get_plugins` reloads (tests, env changes)."""
    global _plugins
    _plugins = None
