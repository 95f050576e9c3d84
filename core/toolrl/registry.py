"""Name -> part lookup. Every part remembers the plugin that registered it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

KINDS = ("tool_parsers", "tools", "reward_functions", "rollout_engines")
# Singular words for messages: "unknown tool 'x'".
KIND_WORDS = {
    "tool_parsers": "tool parser",
    "tools": "tool",
    "reward_functions": "reward function",
    "rollout_engines": "rollout engine",
}


class RegistryError(LookupError):
    """A part name that cannot be resolved: unknown, or registered by two plugins."""


@dataclass
class Part:
    kind: str
    name: str
    plugin: str
    target: Any  # the object, or a lazy "module:attr" reference
    aliases: tuple[str, ...] = ()
    _loaded: Any = field(default=None, repr=False)

    def load(self) -> Any:
        """The part itself, importing a lazy reference on first use."""
        if self._loaded is None:
            if isinstance(self.target, str):
                module_name, _, attr = self.target.partition(":")
                obj: Any = importlib.import_module(module_name)
                for piece in attr.split("."):
                    obj = getattr(obj, piece)
                self._loaded = obj
            else:
                self._loaded = self.target
        return self._loaded


class Registry:
    def __init__(self) -> None:
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

    def has(self, kind: str, name: str) -> bool:
        return name in self._parts[kind] or name in self._aliases[kind]

    def get(self, kind: str, name: str) -> Part:
        if name in self._conflicts[kind]:
            raise RegistryError(self._conflict_message(kind, name))
        part = self._parts[kind].get(name) or self._parts[kind].get(self._aliases[kind].get(name, ""))
        if part is None:
            choices = ", ".join(self.names(kind)) or "none installed"
            raise RegistryError(f"unknown {KIND_WORDS[kind]} {name!r} (available: {choices})")
        return part

    def load(self, kind: str, name: str) -> Any:
        return self.get(kind, name).load()
