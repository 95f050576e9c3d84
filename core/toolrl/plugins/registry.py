"""Name -> part lookup. Every part remembers the plugin that registered it.

Parts are checked against what their kind requires (:func:`check_part`: :data:`KIND_BASES`; a reward
function a class whose instances are callable; a tool's class-level ``schema`` a valid OpenAI function
schema) as soon as that imports nothing: registered as an object, or as a lazy reference into a module
already imported. Other lazy references are checked when first loaded; the error names the plugin.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Every kind of part (the ``register_*`` hooks' suffixes), with its singular word for messages: "unknown tool 'x'".
KIND_WORDS = {
    "tool_parsers": "tool parser",
    "tools": "tool",
    "reward_functions": "reward function",
    "rollout_engines": "rollout engine",
    "environments": "environment",
    "loggers": "logger",
    "advantage_estimators": "advantage estimator",
    "policy_losses": "policy loss",
    "model_families": "model family",
    "environment_sessions": "environment session",
    "context_policies": "context policy",
    "weight_transports": "weight transport",
    "agents": "agent",
    "curricula": "curriculum",
    "gateway_protocols": "gateway protocol",
}
KINDS = tuple(KIND_WORDS)


# The base class each kind's parts subclass. Looked up in sys.modules only: if the base's module was
# never imported, nothing can subclass it, so checking imports nothing (list-plugins stays light).
KIND_BASES = {
    "tool_parsers": ("toolrl.parsers", "ToolParser"),
    "tools": ("toolrl.tools", "Tool"),
    "rollout_engines": ("toolrl.engines", "RolloutEngine"),
    "environments": ("toolrl.environments", "Environment"),  # an instance, not a subclass
    "loggers": ("toolrl.loggers", "Logger"),
    "advantage_estimators": ("toolrl.algorithms", "AdvantageEstimator"),
    "policy_losses": ("toolrl.algorithms", "PolicyLoss"),
    "model_families": ("toolrl.families", "ModelFamily"),  # an instance
    "environment_sessions": ("toolrl.sessions", "EnvironmentSession"),
    "context_policies": ("toolrl.context", "ContextPolicy"),
    "weight_transports": ("toolrl.transports", "WeightTransport"),
    "agents": ("toolrl.agents", "Agent"),
    "curricula": ("toolrl.curricula", "Curriculum"),
    "gateway_protocols": ("toolrl.gateway.protocols", "GatewayProtocol"),
}
INSTANCE_KINDS = ("environments", "model_families")  # parts that are objects of their base, not subclasses
LAZY_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class RegistryError(LookupError):
    """A part name that cannot be resolved: unknown, or registered by two plugins."""


class UnknownPart(RegistryError):
    """A name no plugin registers (nor as an alias)."""


def import_reference(reference: str) -> Any:
    """The object a lazy ``module:attr`` reference names (``attr`` may be dotted), its module imported."""
    module_name, _, attr = reference.partition(":")
    obj: Any = importlib.import_module(module_name)
    for piece in attr.split("."):
        obj = getattr(obj, piece)
    return obj


class PartError(RegistryError):
    """A registered part that does not import or is not what its kind requires."""


def describe_exception(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the code called sys.exit()"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def check_part(kind: str, obj: Any) -> str | None:
    """Why ``obj`` cannot be a part of ``kind`` (a phrase completing "the part ..."), or None."""
    if kind == "reward_functions":
        # Constructed with the config's options, then called as reward(response, ground_truth, **info).
        if not isinstance(obj, type) or not any("__call__" in vars(c) for c in obj.__mro__[:-1]):
            return (f"is {obj!r}, which is not a reward function class (a class whose instances are called "
                    "as reward(response, ground_truth, **info) -> float; see toolrl.rewards.RewardFunction)")
        return None
    module_name, base_name = KIND_BASES[kind]
    module = sys.modules.get(module_name)
    base = getattr(module, base_name, None) if module is not None else None
    if kind in INSTANCE_KINDS:
        if base is None or not isinstance(obj, base):
            return f"is {obj!r}, which is not a {module_name}.{base_name} instance"
        return None
    if not (isinstance(obj, type) and base is not None and issubclass(obj, base)):
        return f"is {obj!r}, which is not a {module_name}.{base_name} subclass"
    if kind == "tools" and obj.schema is not None:
        from pydantic import ValidationError

        from toolrl.config import format_errors
        from toolrl.schemas import ToolSchema

        try:
            ToolSchema.model_validate(obj.schema)
        except ValidationError as exc:
            return f"has an invalid schema: {format_errors(exc, f'{obj.__module__}.{obj.__qualname__}.schema')}"
    return None


@dataclass
class Part:
    kind: str
    name: str
    plugin: str
    target: Any  # the object, or a lazy "module:attr" reference
    aliases: tuple[str, ...] = ()
    _loaded: Any = field(default=None, repr=False)

    def _label(self) -> str:
        return f"{KIND_WORDS[self.kind]} {self.name!r} (plugin {self.plugin!r})"

    def precheck(self) -> str | None:
        """At registration: the reference's form, and the object itself if it is at hand without
        importing anything. Returns the error, or None."""
        obj = self.target
        if isinstance(self.target, str):
            if not LAZY_REFERENCE.match(self.target):
                return f"{self._label()}: lazy reference {self.target!r} is not 'package.module:Attribute'"
            module = sys.modules.get(self.target.partition(":")[0])
            if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
                return None  # not imported, or being imported (plugins loaded from inside it): checked at load
            try:
                obj = import_reference(self.target)  # its module imported already: nothing is imported
            except AttributeError as exc:
                return f"{self._label()}: {self.target!r} does not resolve: {exc}"
        problem = check_part(self.kind, obj)
        return f"{self._label()} {problem}" if problem else None

    def load(self) -> Any:
        """The part itself, importing a lazy reference on first use and checking it; raises
        :class:`PartError` naming the plugin when it does not import or is the wrong kind of thing."""
        if self._loaded is None:
            obj = self.target
            if isinstance(self.target, str):
                try:
                    obj = import_reference(self.target)
                except BaseException as exc:  # a module calling sys.exit() at import is contained too
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    raise PartError(f"{self._label()}: {self.target!r} does not import: "
                                    f"{describe_exception(exc)}") from None
            problem = check_part(self.kind, obj)
            if problem:
                raise PartError(f"{self._label()} {problem}")
            self._loaded = obj
        return self._loaded


class Registry:
    def __init__(self, on_part_error: Callable[[Part, str], None] | None = None) -> None:
        # Told when a part fails to load, so its plugin's status can say so.
        self.on_part_error = on_part_error
        self._parts: dict[str, dict[str, Part]] = {k: {} for k in KINDS}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in KINDS}
        # name -> plugins that all registered it; such names resolve to an error.
        self._conflicts: dict[str, dict[str, list[str]]] = {k: {} for k in KINDS}

    def add(self, part: Part) -> str | None:
        """Add a part; returns a conflict message naming both plugins, or None."""
        kind, name = part.kind, part.name
        conflicts = self._conflicts[kind]
        if name in conflicts:
            conflicts[name].append(part.plugin)
            return self._conflict_message(kind, name)
        existing = self._parts[kind].get(name)
        if existing is not None:
            del self._parts[kind][name]
            conflicts[name] = [existing.plugin, part.plugin]
            return self._conflict_message(kind, name)
        self._parts[kind][name] = part
        for alias in part.aliases:
            self._aliases[kind].setdefault(alias, name)
        return None

    def _conflict_message(self, kind: str, name: str) -> str:
        plugins = " and ".join(repr(p) for p in self._conflicts[kind][name])
        return (
            f"{KIND_WORDS[kind]} {name!r} is registered by plugins {plugins}; "
            "disable one with TOOLRL_DISABLE_PLUGINS"
        )

    def names(self, kind: str) -> list[str]:
        return sorted(self._parts[kind])

    def parts(self, kind: str) -> list[Part]:
        return [self._parts[kind][n] for n in self.names(kind)]

    def aliases(self, kind: str, name: str) -> list[str]:
        """The aliases that resolve to ``name``."""
        return sorted(a for a, n in self._aliases[kind].items() if n == name)

    def has(self, kind: str, name: str) -> bool:
        return name in self._parts[kind] or name in self._aliases[kind]

    def get(self, kind: str, name: str) -> Part:
        if name in self._conflicts[kind]:
            raise RegistryError(self._conflict_message(kind, name))
        part = self._parts[kind].get(name) or self._parts[kind].get(self._aliases[kind].get(name, ""))
        if part is None:
            raise UnknownPart(f"unknown {KIND_WORDS[kind]} {name!r}{self._suggestion(kind, name)}")
        return part

    def _suggestion(self, kind: str, name: str) -> str:
        """" (did you mean 'x'? available: ...)": the closest registered name or alias, then every name
        and every alias (as ``alias (= name)``)."""
        import difflib

        names = self.names(kind)
        aliases = self._aliases[kind]
        close = difflib.get_close_matches(name, [*names, *aliases], n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        listed = [*names, *(f"{a} (= {aliases[a]})" for a in sorted(aliases) if aliases[a] in self._parts[kind])]
        return f" ({hint}available: {', '.join(listed) or 'none installed'})"

    def load(self, kind: str, name: str) -> Any:
        part = self.get(kind, name)
        try:
            return part.load()
        except PartError as exc:
            self.report(part, str(exc))
            raise

    def report(self, part: Part, message: str) -> None:
        """A part that loaded but cannot be used (a model family naming a parser no plugin registers):
        its plugin's status says so, as for a part that fails to load."""
        if self.on_part_error is not None:
            self.on_part_error(part, message)
