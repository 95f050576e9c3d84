"""The model family part kind: what the rollout needs to know about a chat template it did not write (the
fields of :class:`ModelFamily`). Families are chosen by ``model.chat_format`` or detected from a tokenizer;
templates are read from the tokenizer, the installed ``trl`` package or the family's package data, never
fetched.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolrl.config import ConfigError
from toolrl.plugins.parts import (
    BuildContext,
    NoOptions,
    build_part,
    has_part,
    part_plugin,
    registered_part,
    registered_parts,
    report_part,
)
from toolrl.plugins.registry import LAZY_REFERENCE
from toolrl.templates import trl_template

KIND = "model_families"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class FamilyError(ConfigError):
    """A family that is not known, or a template that no family matches."""


class Template(BaseModel):
    """A chat template: one of those the installed ``trl`` package ships (``trl``: its file name in
    ``trl/chat_templates``), a file shipped as package data (``resource``: ``"package:path/in/it.jinja"``,
    read when first rendered) or jinja given inline (``jinja``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trl: str | None = Field(None, pattern=r"^[\w.\-]+\.jinja$")
    resource: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[\w.\-/]+$")
    jinja: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Template:
        if sum(v is not None for v in (self.trl, self.resource, self.jinja)) != 1:
            raise ValueError("a template is one of trl (a file name), resource ('package:file') or jinja "
                             "(the template)")
        return self

    def text(self) -> str:
        if self.resource is not None:
            package, _, file = self.resource.partition(":")
            return resources.files(package).joinpath(file).read_text(encoding="utf-8")
        return self.jinja if self.jinja is not None else trl_template(self.trl)  # type: ignore[arg-type]


class Detection(BaseModel):
    """How a tokenizer is recognised as the family's when ``model.chat_format`` is unset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokenizer_classes: tuple[str, ...] = Field((), description="tokenizer class names that hold no template "
                                               "and belong to the family (MistralCommonBackend)")
    templates: tuple[Template, ...] = Field((), description="the family's templates, matched byte for byte")
    # Substrings all present in a template of this family that is no copy of one of its templates.
    markers: tuple[str, ...] = ()
    # Families are tried highest first (then by name), templates before markers: a family whose
    # markers include another's must come first (Qwen3.5's XML calls before Qwen3's, before ChatML).
    priority: int = 0


class ModelFamily(BaseModel):
    """One model family, registered as this object or as a lazy reference ``"package.module:FAMILY"``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    Options: ClassVar[type[BaseModel]] = NoOptions

    name: str = Field(pattern=NAME_PATTERN, description="what model.chat_format names it by")
    parser: str = Field(min_length=1, description="the registered tool parser for the family's outputs")
    end_of_turn: str = Field(min_length=1, description="the token that closes an assistant turn")
    stop_tokens: tuple[str, ...] = Field((), description="tokens besides end_of_turn that end a generation")
    special_tokens: tuple[str, ...] = Field((), description="tokens its tokenizers hold besides the vocabulary")
    detection: Detection = Detection()
    template: Template | None = Field(None, description="the chat template the family's models ship with "
                                      "(default: its first detection template); model.chat_format renders "
                                      "with it when the tokenizer's template is not the family's")
    training_template: Template | None = Field(None, description="the history-preserving twin of its template")
    renderer: str | None = Field(None, pattern=LAZY_REFERENCE.pattern, description=(
        "'package.module:Class', a toolrl.renderers.chat.ChatRenderer subclass, for a family whose turns the "
        "built-in renderer cannot re-render (Mistral's request encoding, gpt-oss's channels); None: built-in"))

    def build(self, options: BaseModel, context: Any = None) -> ModelFamily:
        """A family is data: built, it is itself."""
        return self

    def own_template(self) -> Template | None:
        """The template its models ship with: ``template``, else its first detection template."""
        return self.template or next(iter(self.detection.templates), None)

    def tokens(self) -> list[tuple[str, str]]:
        """(what it is, token) for every token the family needs its tokenizers to hold."""
        return [("end-of-turn token", self.end_of_turn), *(("stop token", t) for t in self.stop_tokens),
                *(("special token", t) for t in self.special_tokens)]


def family_named(name: str, where: str = "model.chat_format") -> ModelFamily:
    """The family registered as ``name`` (what ``model.chat_format`` names); a one-line FamilyError naming
    ``where`` (the field, with its file and line) when it is unknown, does not load or names what is not
    there (its plugin's status says so too, and the other families stay usable)."""
    try:
        part = registered_part(KIND, name, where)
        family: ModelFamily = build_part(KIND, part.name, None, BuildContext(where))
    except ConfigError as exc:
        raise FamilyError(str(exc)) from None
    problem = None
    if family.name != part.name:
        problem = f"is registered as {part.name!r} but named {family.name!r}"
    elif not has_part("tool_parsers", family.parser):
        problem = f"names tool parser {family.parser!r}, which no plugin registers"
    if problem is None:
        return family
    message = f"model family {part.name!r} (plugin {part.plugin!r}) {problem}"
    report_part(KIND, part.name, message)
    raise FamilyError(f"{where}: {message}")


def registered_families() -> list[ModelFamily]:
    """Every usable family, in detection order."""
    loaded = []
    for part in registered_parts(KIND):
        try:
            loaded.append(family_named(part.name, KIND))
        except FamilyError:  # reported against its plugin; the others stay usable
            continue
    return sorted(loaded, key=lambda f: (-f.detection.priority, f.name))


def plugin_of(family: ModelFamily) -> str | None:
    """The plugin that registered ``family`` (for messages), if it is registered."""
    return part_plugin(KIND, family.name)


def detect_family(template: str, families: list[ModelFamily] | None = None) -> ModelFamily:
    """The family of a chat template: one whose template it is byte for byte, else one whose markers
    it holds (among ``families``, default: every registered one)."""
    families = families if families is not None else registered_families()
    for family in families:
        if any(_same_template(template, t) for t in family.detection.templates):
            return family
    for family in families:
        markers = family.detection.markers
        if markers and all(marker in template for marker in markers):
            return family
    raise FamilyError("the chat template matches no known model family; set model.chat_format "
                      f"(one of {', '.join(f.name for f in families)})")


def _same_template(template: str, source: Template) -> bool:
    try:
        return template.strip() == source.text().strip()
    except (FileNotFoundError, ModuleNotFoundError):  # TRL missing, or an older one without the file
        return False


def tokenizer_family(tokenizer: Any, chat_format: str | None = None,
                     where: str = "model.chat_format") -> ModelFamily:
    """The family named by ``chat_format`` (an error names ``where``), else the one the tokenizer
    belongs to."""
    if chat_format is not None:
        return family_named(chat_format, where)
    families = registered_families()
    for family in families:
        if type(tokenizer).__name__ in family.detection.tokenizer_classes:  # no template to read
            return family
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        raise FamilyError("the tokenizer has no chat template; set model.chat_format")
    return detect_family(template, families)


def missing_token(family: ModelFamily, tokenizer: Any) -> str | None:
    """The first of the family's tokens (:meth:`ModelFamily.tokens`) that the tokenizer does not hold
    as one token, in words; None when it holds all (or cannot be asked: no ``convert_tokens_to_ids``)."""
    if getattr(tokenizer, "convert_tokens_to_ids", None) is None:
        return None
    for what, token in family.tokens():
        if token_id(tokenizer, token) is None:
            return f"{what} {token!r}"
    return None


def token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` when the tokenizer holds it as one token, else None. Asked one token at a time:
    ``get_vocab()`` builds the whole vocabulary as a dict (90 ms for Qwen's 151k tokens)."""
    try:
        found = tokenizer.convert_tokens_to_ids(token)
    except (KeyError, ValueError, TypeError):
        return None
    if found is None or (found == getattr(tokenizer, "unk_token_id", None) and token != getattr(tokenizer, "unk_token", None)):
        return None
    return found
