"""The build contract, checked for a registered part of any kind (:mod:`toolrl.plugins.parts`): it
has an ``Options`` pydantic model (declared, or derived from its constructor) and a ``build`` (or is
a class its constructor builds), and, where its options all have defaults and the kind needs no
outside input (a model, a tool entry), it builds from no options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from toolrl.config import ConfigError
from toolrl.plugins.parts import BuildContext, build_part, lookup_part, options_model

if TYPE_CHECKING:
    from toolrl.plugins import Plugins

# Kinds whose parts build from options alone (no model source, tool entry or algorithm section).
SELF_CONTAINED = ("tool_parsers", "reward_functions", "loggers", "model_families", "environments")


def check_build_contract(kind: str, name: str, plugins: Plugins | None = None) -> None:
    """Raise AssertionError saying what the part ``name`` of ``kind`` lacks."""
    part: Any = lookup_part(kind, name, f"{kind} {name!r}", plugins)
    model = options_model(part)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise AssertionError(f"{kind} {name!r}: Options is {model!r}, not a pydantic model")
    build = getattr(part, "build", None)
    if build is not None and not callable(build):
        raise AssertionError(f"{kind} {name!r}: build is {build!r}, not callable")
    if build is None and not isinstance(part, type):
        raise AssertionError(f"{kind} {name!r}: an instance part needs build(options, context)")
    try:
        model.model_validate({})
    except ValidationError:
        return  # required options: nothing to build from defaults
    if kind in SELF_CONTAINED:
        try:
            built = build_part(kind, name, {}, BuildContext(f"{kind} {name}"))
        except ConfigError as exc:
            raise AssertionError(f"{kind} {name!r}: does not build from its default options: {exc}") from None
        if built is None:
            raise AssertionError(f"{kind} {name!r}: build returned None")
