"""A model family's renderer: the family (:mod:`toolrl.families`, named by ``model.chat_format`` or
detected from the tokenizer) gives the end-of-turn and stop tokens, the template prompts render with
(``model.chat_template``, else a named family's own when the tokenizer's is not the family's), the
training template that ``rollout.template_rewrite: training_template`` renders with, and the renderer
class. The family's tokens are checked against the tokenizer before any model loads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolrl.config import Config, ConfigError, field_where, read_text, resolve_path
from toolrl.families import (
    FamilyError,
    ModelFamily,
    detect_family,
    family_named,
    missing_token,
    plugin_of,
    registered_families,
    tokenizer_family,
)
from toolrl.plugins.parts import describe_exception, has_part
from toolrl.plugins.registry import import_reference
from toolrl.renderers.chat import ChatRenderer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def training_template(family: ModelFamily) -> str:
    """The family's history-preserving template (TRL's ``*_training.jinja``, or the family's own)."""
    if family.training_template is None:
        raise FamilyError(f"rollout.template_rewrite=training_template: family {family.name!r} has no "
                          "history-preserving training template; use fork or refuse")
    return family.training_template.text()


def renderer_factory(tokenizer: Any, chat_format: str | None = None, rule: str = "keep",
                     processor: Any = None, chat_template: str | None = None,
                     where: str = "model.chat_format") -> Callable[[Sequence[dict[str, Any]]], ChatRenderer]:
    """(tool schemas) -> the renderer a rollout uses: the family's end-of-turn token and the template
    (under ``template_rewrite: training_template`` the family's training template; else
    ``chat_template``, the text ``model.chat_template`` names; else, for a family ``chat_format`` names,
    its own template unless the tokenizer's is the family's). A template no family matches keeps the
    generic rendering unless the config needs its family. A family whose tokens the tokenizer lacks is
    a FamilyError naming ``where``. ``processor``: a vision-language model's
    (toolrl.model_sources.load_processor), which renders images."""
    try:
        family: ModelFamily | None = tokenizer_family(tokenizer, chat_format, where)
    except FamilyError:
        if rule == "training_template" or chat_format is not None:
            raise
        family = None
    if family is not None and tokenizer is not None and (missing := missing_token(family, tokenizer)):
        raise FamilyError(f"{where if chat_format is not None else 'the chat template'}: model family "
                          f"{family.name!r} (plugin {plugin_of(family)!r}) needs its {missing}, which the "
                          "tokenizer does not hold as one token")
    if family is not None and rule == "training_template":
        template = training_template(family)
    elif chat_template is not None:
        template = chat_template
    else:
        template = _family_template(tokenizer, family) if chat_format is not None else None
    end_of_turn = family.end_of_turn if family is not None else None
    stops = family.stop_tokens if family is not None else ()
    renderer = renderer_class(family)
    return lambda schemas: renderer(tokenizer, schemas, template, end_of_turn, stops, processor)


def _family_template(tokenizer: Any, family: ModelFamily | None) -> str | None:
    """A named family's own template, unless the tokenizer's template already is one of the family's
    (then the tokenizer's, as it was written); None: the tokenizer's."""
    own = family.own_template() if family is not None else None
    if own is None:
        return None
    current = getattr(tokenizer, "chat_template", None)
    if isinstance(current, str):
        try:
            if detect_family(current).name == family.name:  # type: ignore[union-attr]
                return None
        except FamilyError:
            pass
    return own.text()


def config_renderer_factory(config: Config, tokenizer: Any,
                            processor: Any = None) -> Callable[[Sequence[dict[str, Any]]], ChatRenderer]:
    """:func:`renderer_factory` as the config sets it up: ``model.chat_format``, ``model.chat_template``
    and ``rollout.template_rewrite``, errors naming the file and line they were set on. Called before
    any model loads: its checks (the family's tokens, the chosen template's) are the start's."""
    template = None
    if config.model.chat_template is not None:
        template = chat_template_text(config, config.model.chat_template)
        check_chosen_template(template, tokenizer, field_where(config, "model.chat_template"))
    return renderer_factory(tokenizer, config.model.chat_format, config.rollout.template_rewrite, processor,
                            template, field_where(config, "model.chat_format"))


def chat_template_text(config: Config, spec: str) -> str:
    """What ``model.chat_template`` names: a jinja file (relative to the config's directory), else a
    registered model family, whose own template it is."""
    where = field_where(config, "model.chat_template")
    path = resolve_path(config, spec)
    if path.is_file():
        return read_text(path)
    named = "/" not in spec and not Path(spec).suffix and has_part("model_families", spec)
    own = family_named(spec, where).own_template() if named else None
    if own is not None:
        return own.text()
    names = ", ".join(f.name for f in registered_families() if f.own_template() is not None)
    if named:
        raise FamilyError(f"{where}: model family {spec!r} bundles no template (families that do: {names})")
    raise ConfigError(f"{where}: {spec!r} is neither a template file (no {path}) nor a model family "
                      f"(families with a template: {names})")


def check_chosen_template(text: str, tokenizer: Any, where: str) -> None:
    """A template ``model.chat_template`` chose must say something, and a family's template needs the
    family's tokens in the tokenizer, as ``model.chat_format`` does (a ConfigError naming ``where``)."""
    if not text.strip():
        raise ConfigError(f"{where}: the template is empty")
    try:
        family = detect_family(text)
    except FamilyError:
        return
    if family is not None and (missing := missing_token(family, tokenizer)):
        raise ConfigError(f"{where}: the template is model family {family.name!r}'s (plugin {plugin_of(family)!r}), "
                          f"whose {missing} the tokenizer does not hold as one token: a template of another "
                          "model's family")


def renderer_class(family: ModelFamily | None) -> type[ChatRenderer]:
    """The family's renderer: the built-in one unless the family names its own (Mistral's and
    gpt-oss's rebuild the model's turns as structured messages for re-rendering: their templates read
    calls, not the text the model wrote). A renderer that does not import, or is no ChatRenderer, is
    a FamilyError naming the family and its plugin."""
    if family is None or family.renderer is None:
        return ChatRenderer
    where = f"model family {family.name!r} (plugin {plugin_of(family)!r}): renderer {family.renderer!r}"
    try:
        cls = import_reference(family.renderer)
    except Exception as exc:  # the plugin's code: its error becomes the family's, one line
        raise FamilyError(f"{where} does not import: {describe_exception(exc)}") from None
    if not (isinstance(cls, type) and issubclass(cls, ChatRenderer)):
        raise FamilyError(f"{where} is not a toolrl.renderers.chat.ChatRenderer subclass")
    return cls
