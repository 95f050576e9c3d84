"""One way to build a part of any kind: :func:`build_part` (and :func:`lookup_part`, the one lookup).

The contract every kind follows: a registered part has an ``Options`` pydantic model and
``build(options, context)``, both defaulted by its kind's base class; a part with neither (a reward
function) is called with the options its constructor names. Every failure of :func:`build_part` is one
:class:`~toolrl.config.ConfigError` naming the config field (an unknown name with the available ones and
a "did you mean", and the distribution that provided it when that is gone).

Nothing outside :mod:`toolrl.plugins` reads the registry: what the rest of toolrl needs of it
(:func:`registered_parts`, :func:`part_plugin`, :func:`report_part`) is here.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from toolrl.config import ConfigError, field_where, format_errors, one_line
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part, RegistryError, UnknownPart, check_part, describe_exception

if typing.TYPE_CHECKING:
    from toolrl.config import Config
    from toolrl.plugins import Plugins

# Kinds whose config may name an importable ``package.module.Class`` that no plugin registers (verl's
# tool configs name tool classes by import path).
IMPORTABLE_KINDS = ("tools",)


@dataclass(frozen=True)
class BuildContext:
    """What a part is built in: the config field that named it (``where``) and the one that holds its
    options (``options_where``), the run's config when there is one, and what the kind builds from
    besides options (``inputs``: an engine's model source, an estimator's algorithm section, a tool's
    config entry...)."""

    where: str
    options_where: str = ""
    config: Any = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    # The options' own dotted field in ``config`` (``engine.options``): each bad option is then named
    # where it was written, its file line or the override that set it, not where the block was.
    options_field: str = ""

    @property
    def options_named(self) -> str:
        """How errors name the options: after the line or override that wrote them when their field is
        known (:func:`toolrl.config.field_where`), else ``options_where`` (or ``where``)."""
        if self.config is not None and self.options_field:
            return field_where(self.config, self.options_field)
        return self.options_where or self.where

    def input(self, name: str) -> Any:
        if name not in self.inputs:
            raise TypeError(f"{self.where}: building this part needs context.inputs[{name!r}]")
        return self.inputs[name]


@dataclass(frozen=True)
class RunFacts:
    """The run as a part's ``check_run`` sees it (:mod:`toolrl.processes.run_check`), before any weights
    load: ``config`` (resolved), ``model_dir`` with its ``model_config`` (``config.json`` as a dict; empty
    when there is none) and that config's language-model part (``text_config``: a vision-language model's
    own), the ``tokenizer``, the model's context ``window`` in tokens (None when unstated) and where it
    is stated, and for a route's parts (parser, context policy) the route's ``parser``."""

    config: Config
    model_dir: str
    model_config: Mapping[str, Any]
    text_config: Mapping[str, Any]
    tokenizer: Any
    window: int | None
    window_stated: str = ""
    parser: Any = None

    @property
    def experts(self) -> int:
        """Routed experts per layer of a mixture-of-experts model; 0 for a dense one."""
        for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
            value = self.text_config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return value
        return 0

    @property
    def in_process(self) -> bool:
        """Whether every process runs in this one (no Ray): weights then never travel."""
        return self.config.ray.address is None

    def where(self, field: str) -> str:
        """``field`` as errors name it (:func:`toolrl.config.field_where`)."""
        return field_where(self.config, field)


def _plugins(plugins: Plugins | None) -> Plugins:
    return plugins if plugins is not None else get_plugins()


def registered_part(kind: str, name: str, where: str, plugins: Plugins | None = None) -> Part:
    """The registration of ``name`` (a name or an alias), not imported; a one-line ConfigError naming
    ``where`` when it is unknown or registered twice."""
    loaded = _plugins(plugins)
    try:
        return loaded.registry.get(kind, name)
    except UnknownPart as exc:
        raise ConfigError(f"{where}: {exc}{loaded.removed_provider(kind, name)}") from None
    except RegistryError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def lookup_part(kind: str, name: str, where: str, plugins: Plugins | None = None) -> Any:
    """The registered part ``name`` of ``kind`` (imported on first use); a ConfigError naming ``where``
    when it is unknown, registered twice or broken. A kind in :data:`IMPORTABLE_KINDS` also takes an
    importable ``package.module.Class`` that no plugin registers."""
    loaded = _plugins(plugins)
    if kind in IMPORTABLE_KINDS and "." in name and not loaded.registry.has(kind, name):
        return _imported(kind, name, where)
    registered_part(kind, name, where, loaded)
    try:
        return loaded.load_part(kind, name)
    except RegistryError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _imported(kind: str, path: str, where: str) -> Any:
    """The class at import path ``module.Class``, checked as ``kind``'s parts are."""
    module_name, _, attr = path.rpartition(".")
    try:
        # What the module prints at import is no output of ours; exiting at import is a failed import.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            obj = getattr(importlib.import_module(module_name), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit from a module calling sys.exit() at import too
        raise ConfigError(f"{where} {path!r}: cannot import ({describe_exception(exc)})") from None
    problem = check_part(kind, obj)
    if problem:
        raise ConfigError(f"{where} {path!r} {problem}")
    return obj


def registered_parts(kind: str, plugins: Plugins | None = None) -> list[Part]:
    """Every registration of ``kind``, by name, none imported (listings: ``toolrl tool list``...)."""
    return _plugins(plugins).registry.parts(kind)


def part_plugin(kind: str, name: str, plugins: Plugins | None = None) -> str | None:
    """The plugin that registered ``name`` of ``kind`` (for messages); None when none did."""
    registry = _plugins(plugins).registry
    return registry.get(kind, name).plugin if registry.has(kind, name) else None


def has_part(kind: str, name: str, plugins: Plugins | None = None) -> bool:
    """Whether ``name`` (or an alias) of ``kind`` is registered, without importing it."""
    return _plugins(plugins).registry.has(kind, name)


def report_part(kind: str, name: str, message: str, plugins: Plugins | None = None) -> None:
    """A part that loaded but cannot be used (a model family naming a parser no plugin registers):
    its plugin's status says so, as for a part that fails to load."""
    registry = _plugins(plugins).registry
    registry.report(registry.get(kind, name), message)


def options_model(part: Any) -> type[BaseModel]:
    """The part's ``Options``, or for a class without one, a model of its constructor's keyword
    parameters (``**kwargs`` lets unknown keys through; none at all: no options)."""
    declared = getattr(part, "Options", None)
    if isinstance(declared, type) and issubclass(declared, BaseModel):
        return declared
    if not isinstance(part, type):
        return NoOptions
    return _signature_options(part)


class NoOptions(BaseModel):
    """The options of a part that takes none (an unknown key is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class UncheckedOptions(BaseModel):
    """The options of a part that checks them itself, later: passed on as given (any key)."""

    model_config = ConfigDict(extra="allow")


def _signature_options(cls: type) -> type[BaseModel]:
    try:  # string annotations (``from __future__ import annotations``) resolved where they can be
        hints = typing.get_type_hints(cls.__init__)
    except Exception:
        hints = {}
    fields: dict[str, Any] = {}
    extra = "forbid"
    for p in list(inspect.signature(cls).parameters.values()):
        if p.kind is p.VAR_KEYWORD:
            extra = "allow"
        elif p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            fields[p.name] = (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
    config = ConfigDict(extra=extra, arbitrary_types_allowed=True)  # type: ignore[typeddict-item]
    return create_model(f"{cls.__name__}Options", __config__=config, **fields)


def checked_options(part: Any, options: Mapping[str, Any] | None, where: str, config: Any = None,
                    field: str = "") -> BaseModel:
    """``options`` validated against the part's :func:`options_model`; a ConfigError naming ``where``
    and the field otherwise, or, given the run's ``config`` and the options' dotted ``field``, each bad
    option where it was written (:func:`toolrl.config.field_where`)."""
    model = options_model(part)
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as exc:
        if config is not None and field:
            raise ConfigError(format_errors(exc, field, model, name=lambda loc: field_where(config, loc))) from None
        raise ConfigError(format_errors(exc, where, model)) from None


def namesake_note(kind: str, name: str, plugins: Plugins | None = None) -> str:
    """"; ..." when ``name`` is a built-in's part and an outside plugin of that plugin name was refused
    (its options errors are the built-in's: the user most likely meant theirs); "" otherwise."""
    return _plugins(plugins).refused_namesake(kind, name)


def build_part(kind: str, name: str, options: Mapping[str, Any] | None, context: BuildContext) -> Any:
    """The part ``name`` of ``kind`` built with ``options``: looked up, options validated against its
    ``Options``, then ``build(options, context)`` (or the constructor). What a part's ``build`` returns
    is the kind's to define (tools build asynchronously: an awaitable)."""
    part = lookup_part(kind, name, context.where)
    try:
        return build_found(part, options, context)
    except ConfigError as exc:
        if note := namesake_note(kind, name):
            raise ConfigError(f"{exc}{note}") from None
        raise


def build_found(part: Any, options: Mapping[str, Any] | BaseModel | None, context: BuildContext) -> Any:
    """:func:`build_part` for a part :func:`lookup_part` found already (a kind that resolves its parts
    when the config is checked and builds them later, many times: one session per trajectory).
    ``options`` already validated against the part's ``Options`` are used as they are."""
    where = context.options_named
    try:
        validated = options if isinstance(options, options_model(part)) else \
            checked_options(part, options, where, context.config, context.options_field)  # type: ignore[arg-type]
        build = getattr(part, "build", None)
        if callable(build):
            return build(validated, context)
        return part(**validated.model_dump(exclude_unset=True))
    except ValidationError as exc:  # a part that checks its options itself, inside build
        raise ConfigError(format_errors(exc, where)) from None
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a constructor refusing its options says which part it is
        raise ConfigError(f"{where}: {one_line(str(exc))}") from None
