"""Model families: what the rollout needs to know about a chat template it did not write.

A family names the tool parser its model's outputs need, the token that ends an assistant turn (the
stop token, and where a tool-result delta starts), and the chat templates TRL ships for it — the
original, used to recognise a tokenizer's template byte for byte, and the ``*_training.jinja`` twin
that renders history without rewriting it. The family comes from ``model.chat_format`` or is
detected from the template; templates are read from the tokenizer or the installed ``trl`` package,
never fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolrl.config import ConfigError
from toolrl.templates import trl_template

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from toolrl.rollout.chat import ChatRenderer


@dataclass(frozen=True)
class Family:
    name: str
    parser: str  # the registered tool parser for this family's outputs
    end_of_turn: str  # the token that closes an assistant turn
    # Substrings all present in a template of this family, for templates that are no byte-identical
    # copy of TRL's; tried in FAMILIES order, so the more specific families come first.
    markers: tuple[str, ...]
    templates: tuple[str, ...] = ()  # TRL's copies of the family's templates (identity comparison)
    training_template: str | None = None  # TRL's history-preserving twin
    special_tokens: tuple[str, ...] = ()  # tokens a tokenizer of this family holds besides its vocabulary
    stop_tokens: tuple[str, ...] = ()  # tokens besides end_of_turn that end a generation


_QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>")

FAMILIES: tuple[Family, ...] = (
    # Qwen3.5/3.6 and Qwen3-Coder: XML calls (<function=…><parameter=…>).
    Family("qwen3_5", "qwen3_coder", "<|im_end|>", ("<|im_start|>", "<function="),
           ("qwen3_5_think.jinja", "qwen3_5_nothink.jinja", "qwen3_6.jinja"), "qwen3_5_think_training.jinja",
           _QWEN_TOKENS),
    Family("qwen3", "hermes", "<|im_end|>", ("<|im_start|>", "<tool_call>", "<think>"),
           ("qwen3.jinja",), "qwen3_training.jinja", _QWEN_TOKENS),
    Family("qwen2_5", "hermes", "<|im_end|>", ("<|im_start|>", "<tool_call>"),
           ("qwen2_5.jinja",), "qwen2_5_training.jinja",
           ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")),
    # ChatML without tool support (SmolLM2): tool results go in as hermes-wrapped user turns.
    Family("chatml", "hermes", "<|im_end|>", ("<|im_start|>",), (), None, ("<|im_start|>", "<|im_end|>")),
    Family("llama3", "llama3_json", "<|eot_id|>", ("<|start_header_id|>", "<|eot_id|>"),
           ("llama3_1.jinja", "llama3_2.jinja", "llama3.jinja"), "llama3_training.jinja",
           ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
            "<|python_tag|>"), ("<|eom_id|>",)),
    Family("deepseek_v3", "deepseek_v3", "<｜end▁of▁sentence｜>", ("<｜tool▁calls▁begin｜>", "<｜Assistant｜>"),
           ("deepseekv3.jinja",), "deepseekv3_training.jinja",
           ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>")),
    # Mistral: mistral-common encodes the request (transformers' MistralCommonBackend), no jinja;
    # detected from that tokenizer, or from an HF jinja template's markers.
    Family("mistral", "mistral", "</s>", ("[INST]", "[TOOL_CALLS]"), (), None,
           ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
    Family("gpt_oss", "gpt_oss", "<|call|>", ("<|channel|>", "<|message|>"), ("gptoss.jinja",),
           "gptoss_training.jinja",
           ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"),
           ("<|return|>",)),
    Family("glm45", "glm45", "<|observation|>", ("<|observation|>", "<arg_key>"), ("glm4moe.jinja",),
           "glm4moe_training.jinja",
           ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>",
            "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
            "<tool_response>", "</tool_response>", "<|endoftext|>"), ("<|user|>", "<|endoftext|>")),
    # Gemma 3: no tool syntax in its template (it ignores tools=, and a tool-role message breaks its
    # user/model alternation), so tools go in the system prompt and results as hermes-wrapped user turns.
    Family("gemma3", "hermes", "<end_of_turn>", ("<start_of_turn>", "<end_of_turn>"), ("gemma3.jinja",),
           "gemma3_training.jinja", ("<bos>", "<start_of_turn>", "<end_of_turn>")),
    # Gemma 4; TRL has no training twin.
    Family("gemma", "gemma", "<turn|>", ("<|turn>", "<turn|>"),
           ("gemma4.jinja", "gemma4_v2.jinja", "gemma4_v3.jinja", "gemma4_v4.jinja", "gemma4_v5.jinja"), None,
           ("<bos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
            "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|think|>", '<|"|>')),
)

BY_NAME = {f.name: f for f in FAMILIES}


class FamilyError(ConfigError):
    """A family that is not known, or a template that no family matches."""


def family_named(name: str) -> Family:
    if name not in BY_NAME:
        raise FamilyError(f"model.chat_format: unknown family {name!r} (known: {', '.join(BY_NAME)})")
    return BY_NAME[name]


def detect_family(template: str) -> Family:
    """The family of a chat template: TRL's byte-identical copy if there is one, else its markers."""
    for family in FAMILIES:
        if any(_same_template(template, file) for file in family.templates):
            return family
    for family in FAMILIES:
        if all(marker in template for marker in family.markers):
            return family
    raise FamilyError("the chat template matches no known model family; set model.chat_format "
                      f"(one of {', '.join(BY_NAME)})")


def _same_template(template: str, file: str) -> bool:
    try:
        return template.strip() == trl_template(file).strip()
    except (FileNotFoundError, ModuleNotFoundError):
        return False


def tokenizer_family(tokenizer: Any, chat_format: str | None = None) -> Family:
    """The family named by ``chat_format``, else the one the tokenizer's template belongs to."""
    if chat_format is not None:
        return family_named(chat_format)
    if type(tokenizer).__name__ == "MistralCommonBackend":  # no template: mistral-common encodes requests
        return BY_NAME["mistral"]
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        raise FamilyError("the tokenizer has no chat template; set model.chat_format")
    return detect_family(template)


def training_template(family: Family) -> str:
    """The family's history-preserving template (TRL's ``*_training.jinja``)."""
    if family.training_template is None:
        raise FamilyError(f"rollout.template_rewrite=training_template: family {family.name!r} has no "
                          "history-preserving training template in trl; use fork or refuse")
    return trl_template(family.training_template)


def renderer_factory(tokenizer: Any, chat_format: str | None = None, rule: str = "keep",
                     processor: Any = None) -> Callable[[Sequence[dict[str, Any]]], ChatRenderer]:
    """(tool schemas) -> the renderer a rollout uses: the family's end-of-turn token and, under
    ``template_rewrite: training_template``, its training template. A template no family matches
    keeps the generic rendering unless the config needs its family. ``processor``: a vision-language
    model's (toolrl.model_sources.load_processor), which renders images."""
    try:
        family: Family | None = tokenizer_family(tokenizer, chat_format)
    except FamilyError:
        if rule == "training_template":
            raise
        family = None
    template = training_template(family) if family is not None and rule == "training_template" else None
    end_of_turn = family.end_of_turn if family is not None else None
    stops = family.stop_tokens if family is not None else ()
    renderer = renderer_class(family)
    return lambda schemas: renderer(tokenizer, schemas, template, end_of_turn, stops, processor)


def renderer_class(family: Family | None) -> type[ChatRenderer]:
    """The family's renderer: Mistral's and gpt-oss's rebuild the model's turns as structured
    messages for re-rendering (their templates read calls, not the text the model wrote)."""
    from toolrl.rollout.chat import ChatRenderer

    name = family.name if family is not None else None
    if name == "mistral":
        from toolrl.rollout.mistral import MistralRenderer

        return MistralRenderer
    if name == "gpt_oss":
        from toolrl.rollout.harmony import HarmonyRenderer

        return HarmonyRenderer
    return ChatRenderer
