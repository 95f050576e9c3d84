"""The build contract, checked for a registered part of any kind (:mod:`toolrl.plugins.parts`): it
has an ``Options`` pydantic model (declared, or derived from its constructor) and a ``build`` (or is
a class its constructor builds), an unknown option is an error, and, where its options all have
defaults and the kind needs no outside input (a model, a tool entry), it builds from no options."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from toolrl.config import ConfigError
from toolrl.plugins.parts import BuildContext, build_part, lookup_part, options_model
from toolrl.plugins.registry import KIND_WORDS

if TYPE_CHECKING:
    from toolrl.plugins import Plugins

# Kinds whose parts build from options alone (no model source, tool entry or algorithm section).
SELF_CONTAINED = ("tool_parsers", "reward_functions", "loggers", "model_families", "environments")
UNKNOWN = "not_an_option_of_this_part"


def check_build_contract(kind: str, name: str, plugins: Plugins | None = None) -> None:
    """Raise AssertionError saying what the part ``name`` of ``kind`` lacks. ``kind``: a hook's suffix
    (``register_curricula`` -> ``"curricula"``, :data:`toolrl.plugins.registry.KIND_WORDS`); another is a
    ValueError listing them."""
    check_kind(kind)
    part: Any = lookup_part(kind, name, f"{kind} {name!r}", plugins)
    model = options_model(part)  # always a pydantic model: the declared Options, or the constructor's
    build = getattr(part, "build", None)
    if build is not None and not callable(build):
        raise AssertionError(f"{kind} {name!r}: build is {build!r}, not callable")
    if build is None and not isinstance(part, type):
        raise AssertionError(f"{kind} {name!r}: an instance part needs build(options, context)")
    _check_unknown_option_refused(kind, name, part, model)
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


def check_kind(kind: str) -> None:
    """A ValueError listing the kinds, with a "did you mean", when ``kind`` is none of them."""
    if kind in KIND_WORDS:
        return
    words = {word.replace(" ", "_"): k for k, word in KIND_WORDS.items()}  # "curriculum" -> "curricula"
    close = [words[kind]] if kind in words else difflib.get_close_matches(kind, list(KIND_WORDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown kind {kind!r}{hint}: a kind is a register_* hook's suffix, one of "
                     + ", ".join(KIND_WORDS))


def _check_unknown_option_refused(kind: str, name: str, part: Any, model: type[BaseModel]) -> None:
    """A misspelt option must be an error, not a setting silently ignored: refused by ``Options`` (or, for a
    part built from options alone, when it is built). A tool's config is its ``config_model``'s to check."""
    if kind == "tools":
        declared = getattr(part, "config_model", None)
        if declared is not None and declared.model_config.get("extra") != "forbid":
            raise AssertionError(f"{kind} {name!r}: its config_model takes unknown keys: set extra='forbid'")
        return
    try:
        model.model_validate({UNKNOWN: 1})
    except ValidationError as exc:
        if any(e["type"] == "extra_forbidden" for e in exc.errors()):
            return
    if kind in SELF_CONTAINED:  # a part may refuse options itself as it is built (a parser's constructor)
        try:
            build_part(kind, name, {UNKNOWN: 1}, BuildContext(f"{kind} {name}"))
        except ConfigError as exc:
            if UNKNOWN in str(exc):
                return
    raise AssertionError(f"{kind} {name!r}: an unknown option ({UNKNOWN!r}) is accepted; declare Options "
                         "(a pydantic model with extra='forbid')")
