"""A model family's renderer: the family (:mod:`toolrl.families`, named by ``model.chat_format`` or
detected from the tokenizer) gives the end-of-turn and stop tokens, the training template that
``rollout.template_rewrite: training_template`` renders with, and the renderer class."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolrl.families import FamilyError, ModelFamily, plugin_of, tokenizer_family
from toolrl.plugins.registry import describe_exception

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from toolrl.rollout.chat import ChatRenderer


def training_template(family: ModelFamily) -> str:
    """The family's history-preserving template (TRL's ``*_training.jinja``, or the family's own)."""
    if family.training_template is None:
        raise FamilyError(f"rollout.template_rewrite=training_template: family {family.name!r} has no "
                          "history-preserving training template; use fork or refuse")
    return family.training_template.text()


def renderer_factory(tokenizer: Any, chat_format: str | None = None, rule: str = "keep",
                     processor: Any = None) -> Callable[[Sequence[dict[str, Any]]], ChatRenderer]:
    """(tool schemas) -> the renderer a rollout uses: the family's end-of-turn token and, under
    ``template_rewrite: training_template``, its training template. A template no family matches
    keeps the generic rendering unless the config needs its family. ``processor``: a vision-language
    model's (toolrl.model_sources.load_processor), which renders images."""
    try:
        family: ModelFamily | None = tokenizer_family(tokenizer, chat_format)
    except FamilyError:
        if rule == "training_template":
            raise
        family = None
    template = training_template(family) if family is not None and rule == "training_template" else None
    end_of_turn = family.end_of_turn if family is not None else None
    stops = family.stop_tokens if family is not None else ()
    renderer = renderer_class(family)
    return lambda schemas: renderer(tokenizer, schemas, template, end_of_turn, stops, processor)


def renderer_class(family: ModelFamily | None) -> type[ChatRenderer]:
    """The family's renderer: the built-in one unless the family names its own (Mistral's and
    gpt-oss's rebuild the model's turns as structured messages for re-rendering: their templates read
    calls, not the text the model wrote). A renderer that does not import, or is no ChatRenderer, is
    a FamilyError naming the family and its plugin."""
    from toolrl.rollout.chat import ChatRenderer

    if family is None or family.renderer is None:
        return ChatRenderer
    module, _, attr = family.renderer.partition(":")
    where = f"model family {family.name!r} (plugin {plugin_of(family)!r}): renderer {family.renderer!r}"
    try:
        cls: Any = importlib.import_module(module)
        for piece in attr.split("."):
            cls = getattr(cls, piece)
    except Exception as exc:  # the plugin's code: its error becomes the family's, one line
        raise FamilyError(f"{where} does not import: {describe_exception(exc)}") from None
    if not (isinstance(cls, type) and issubclass(cls, ChatRenderer)):
        raise FamilyError(f"{where} is not a toolrl.rollout.chat.ChatRenderer subclass")
    return cls
