"""Model outputs for the model-family tool parsers, shared by their tests, the vLLM parity test and the
throughput benchmark.

Each family's cases cover single and parallel calls, nested JSON, unicode, typed values, calls after
reasoning, calls inside reasoning and malformed calls, written in the exact syntax the family's chat
template renders (trl's ``chat_templates``). ``calls`` is what toolrl's parser returns; ``vllm_calls``
is what vLLM's parser returns where the two differ (only on malformed or out-of-template outputs,
listed with the reason in docs/models.md); ``None`` means the same calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Call = tuple[str, dict[str, Any]]

FAMILIES = ("qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "glm45", "gpt_oss", "gemma")


def _function(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object", "properties": properties}}}


# The tools every case may call (OpenAI function schemas): the XML formats type their values from these.
TOOLS = [
    _function("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}),
    _function("search", {"query": {"type": "string"}, "limit": {"type": "integer"},
                         "filters": {"type": "object", "properties": {
                             "year": {"type": "object", "properties": {"gte": {"type": "integer"},
                                                                       "lt": {"type": "number"}}},
                             "lang": {"type": "array", "items": {"type": "string"}}}}}),
    _function("get_time", {}),
    _function("log", {"entry": {"type": "object"}}),
    _function("python", {"code": {"type": "string"}}),
    _function("configure", {"enabled": {"type": "boolean"}, "ratio": {"type": "number"},
                            "note": {"type": ["string", "null"]}, "zip": {"type": "string"}}),
]

WEATHER: Call = ("get_weather", {"city": "Paris", "days": 3})
SEARCH: Call = ("search", {"query": 'rust "borrow" checker <T> {x}', "limit": 5,
                           "filters": {"year": {"gte": 2020, "lt": 2025.5}, "lang": ["en", "fr"]}})
UNICODE: Call = ("get_weather", {"city": "Zürich 東京 🌧 ñ", "days": 1})
CODE: Call = ("python", {"code": "for i in range(3):\n    print(i, {'k': [i]})"})
TYPED: Call = ("configure", {"enabled": True, "ratio": 0.25, "note": None, "zip": "02139"})


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    text: str
    calls: tuple[Call, ...] = ()
    errors: int = 0
    well_formed: bool = True  # the template's own syntax, every value typed by the schema: vLLM must agree
    vllm_calls: tuple[Call, ...] | None = None  # vLLM's calls where they differ (never on well-formed cases)
    mistral_v11: bool = True  # mistral only: which tokenizer generation vLLM reads the output with


def _text(value: Any) -> str:
    """A value as the XML templates write it: strings bare, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def qwen3_coder(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{_text(v)}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def llama3_json(name: str, arguments: dict[str, Any]) -> str:
    return '{"name": "' + name + '", "parameters": ' + json.dumps(arguments, ensure_ascii=False) + "}"


def mistral(name: str, arguments: dict[str, Any]) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(arguments, ensure_ascii=False)}"


def mistral_pre_v11(*calls: Call) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)


def deepseek_v3(*calls: Call, indent: int | None = None) -> str:
    body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n"
                     f"{json.dumps(a, ensure_ascii=False, indent=indent)}\n```<｜tool▁call▁end｜>" for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def glm45(name: str, arguments: dict[str, Any]) -> str:
    args = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_text(v)}</arg_value>\n" for k, v in arguments.items())
    return f"<tool_call>{name}\n{args}</tool_call>"


def gemma_value(value: Any) -> str:
    """A value as Gemma 4's template writes it (nested keys bare, sorted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return str(value)


def gemma(name: str, arguments: dict[str, Any]) -> str:
    return f"<|tool_call>call:{name}{gemma_value(arguments)}<tool_call|>"


def gpt_oss(name: str, arguments: dict[str, Any], template: bool = False) -> str:
    """A harmony call message: the template's form (recipient first) or the model's (channel first)."""
    args = json.dumps(arguments, ensure_ascii=False)
    if template:  # as the first message it continues the prompt's "<|start|>assistant"
        return f" to=functions.{name}<|channel|>commentary json<|message|>{args}<|call|>"
    return f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>"


def _one_call(family: str, render: Callable[[Call], str]) -> list[Case]:
    """The cases of one call each that every family has: nested JSON, unicode, multi-line code, typed values."""
    calls = {"nested_json": SEARCH, "unicode": UNICODE, "multiline_code": CODE, "typed_values": TYPED}
    return [Case(family, name, render(call), (call,)) for name, call in calls.items()]


def _common(family: str, render: Any, join: str = "\n") -> list[Case]:
    """The cases every one-call-per-block family shares."""
    return [
        Case(family, "single", render(*WEATHER), (WEATHER,)),
        Case(family, "single_after_text", "Let me check the weather.\n\n" + render(*WEATHER), (WEATHER,)),
        Case(family, "parallel", join.join(render(*c) for c in (WEATHER, SEARCH, UNICODE)), (WEATHER, SEARCH, UNICODE)),
        *_one_call(family, lambda call: render(*call)),
    ]


def _qwen3_coder() -> list[Case]:
    f, call = "qwen3_coder", qwen3_coder(*WEATHER)
    return _common(f, qwen3_coder) + [
        Case(f, "reasoning_then_call", "The user wants weather.\n</think>\n\n" + call, (WEATHER,)),
        Case(f, "think_block_then_call", "<think>\nweather?\n</think>\n\n" + call, (WEATHER,)),
        Case(f, "no_call", "The answer is {x | x > 2}.", ()),
        Case(f, "call_inside_reasoning", "<think>maybe " + call + " no.</think>The answer is 4.", (),
             well_formed=False, vllm_calls=(WEATHER,)),
        Case(f, "unterminated", call[:-len("</tool_call>")], (), 1, well_formed=False, vllm_calls=(WEATHER,)),
        Case(f, "missing_function_end", call.replace("</function>\n", ""), (), 1, well_formed=False,
             vllm_calls=(WEATHER,)),
        Case(f, "unclosed_parameter", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", (), 1, well_formed=False,
             vllm_calls=(WEATHER,)),
        Case(f, "missing_name", "<tool_call>\n<function=>\n</function>\n</tool_call>", (), 1, well_formed=False),
        Case(f, "stray_close", "done </tool_call>", (), 1, well_formed=False),
    ]


def _llama3_json() -> list[Case]:
    f, call = "llama3_json", llama3_json(*WEATHER)
    return [
        Case(f, "single", call, (WEATHER,)),
        Case(f, "python_tag", "<|python_tag|>" + call + "<|eom_id|>", (WEATHER,)),
        Case(f, "arguments_key", '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', (WEATHER,)),
        Case(f, "parallel_semicolon", "; ".join(llama3_json(*c) for c in (WEATHER, SEARCH)), (WEATHER, SEARCH)),
        Case(f, "python_tag_parallel", "<|python_tag|>" + llama3_json(*WEATHER) + "; " + llama3_json(*UNICODE),
             (WEATHER, UNICODE)),
        *_one_call(f, lambda call: llama3_json(*call)),
        Case(f, "text_then_call", "I'll look it up.\n" + call, (WEATHER,)),
        Case(f, "no_call", "The answer is $\\frac{1}{2}$.", ()),
        Case(f, "json_answer", '{"name": "Alice", "age": 30}', ()),
        Case(f, "braces_then_call", "The set {1, 2} is small. " + call, (WEATHER,), well_formed=False,
             vllm_calls=()),
        Case(f, "unterminated", call[:-1], (), 1, well_formed=False),
        Case(f, "python_tag_no_json", "<|python_tag|>brave_search.call(query=\"x\")", (), 1, well_formed=False),
        Case(f, "bad_parameters", '<|python_tag|>{"name": "get_weather", "parameters": [1]}', (), 1,
             well_formed=False, vllm_calls=(("get_weather", [1]),)),  # type: ignore[arg-type]
        Case(f, "call_and_bad_object", "<|python_tag|>" + call + '; {"parameters": {}}', (WEATHER,), 1,
             well_formed=False, vllm_calls=()),
    ]


def _mistral() -> list[Case]:
    f, call = "mistral", mistral(*WEATHER)
    return _common(f, mistral, join="") + [
        Case(f, "pre_v11_single", mistral_pre_v11(WEATHER), (WEATHER,), mistral_v11=False),
        Case(f, "pre_v11_parallel", mistral_pre_v11(WEATHER, SEARCH, UNICODE), (WEATHER, SEARCH, UNICODE),
             mistral_v11=False),
        Case(f, "pre_v11_after_text", "Checking.\n" + mistral_pre_v11(CODE), (CODE,), mistral_v11=False),
        # v11 with the call id written (mistral-common writes it so when a call has one); vLLM's parser
        # reads the id into the name.
        Case(f, "call_id", call.replace("[ARGS]", "[CALL_ID]a1b2c3d4e[ARGS]"), (WEATHER,), well_formed=False,
             vllm_calls=(("get_weather[CALL_ID]a1b2c3d4e", WEATHER[1]),)),
        Case(f, "reasoning_then_call", "[THINK]weather?[/THINK]" + call, (WEATHER,)),
        Case(f, "no_call", "It is sunny {probably}.", ()),
        Case(f, "call_inside_reasoning", "[THINK]maybe " + call + "[/THINK]The answer is 4.", (), well_formed=False,
             vllm_calls=(WEATHER,)),
        Case(f, "unterminated", call[:-1], (), 1, well_formed=False, vllm_calls=(("get_weather", call[len("[TOOL_CALLS]get_weather[ARGS]"):-1]),)),
        Case(f, "missing_args", "[TOOL_CALLS]get_weather", (), 1, well_formed=False, vllm_calls=(("get_weather", {}),)),
        Case(f, "pre_v11_missing_name", '[TOOL_CALLS][{"arguments": {}}]', (), 1, well_formed=False,
             mistral_v11=False, vllm_calls=(("", {}),)),
    ]


def _deepseek_v3() -> list[Case]:
    f, call = "deepseek_v3", deepseek_v3(WEATHER)
    return [
        Case(f, "single", call, (WEATHER,)),
        Case(f, "single_after_text", "Let me check.\n\n" + call, (WEATHER,)),
        Case(f, "parallel", deepseek_v3(WEATHER, SEARCH, UNICODE), (WEATHER, SEARCH, UNICODE)),
        *_one_call(f, deepseek_v3),
        Case(f, "reasoning_then_call", "<think>weather?</think>\n\n" + call, (WEATHER,)),
        Case(f, "no_call", "The answer is 4.", ()),
        Case(f, "pretty_printed_arguments", deepseek_v3(SEARCH, indent=2), (SEARCH,), well_formed=False,
             vllm_calls=()),
        Case(f, "call_inside_reasoning", "<think>maybe " + call + "</think>The answer is 4.", (), well_formed=False,
             vllm_calls=(WEATHER,)),
        Case(f, "unterminated", call[:-len("<｜tool▁calls▁end｜>")], (), 1, well_formed=False, vllm_calls=(WEATHER,)),
        Case(f, "invalid_json", deepseek_v3(WEATHER).replace('"Paris"', "Paris"), (), 1, well_formed=False,
             vllm_calls=(("get_weather", '{"city": Paris, "days": 3}'),)),
    ]


def _glm45() -> list[Case]:
    f, call = "glm45", glm45(*WEATHER)
    return _common(f, glm45) + [
        Case(f, "no_arguments", "<tool_call>get_time\n</tool_call>", (("get_time", {}),)),
        Case(f, "reasoning_then_call", "<think>weather?</think>\n" + call, (WEATHER,)),
        Case(f, "no_call", "The answer is 4.", ()),
        Case(f, "call_inside_reasoning", "<think>maybe " + call + "</think>The answer is 4.", (), well_formed=False,
             vllm_calls=(WEATHER,)),
        Case(f, "unterminated", call[:-len("</tool_call>")], (), 1, well_formed=False, vllm_calls=(WEATHER,)),
        Case(f, "key_without_value", "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>", (), 1,
             well_formed=False, vllm_calls=(("get_weather", {}),)),
        Case(f, "unknown_tool", "<tool_call>get_stock\n<arg_key>ticker</arg_key>\n<arg_value>X</arg_value>\n"
             "</tool_call>", (("get_stock", {"ticker": "X"}),), well_formed=False, vllm_calls=()),
    ]


def _gpt_oss() -> list[Case]:
    f = "gpt_oss"
    analysis = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
    return [
        Case(f, "single", analysis + gpt_oss(*WEATHER), (WEATHER,)),
        Case(f, "template_order", gpt_oss(*WEATHER, template=True), (WEATHER,)),
        Case(f, "template_order_after_analysis", analysis + "<|start|>assistant" + gpt_oss(*WEATHER, template=True),
             (WEATHER,)),
        *_one_call(f, lambda call: analysis + gpt_oss(*call)),
        Case(f, "preamble_then_call", analysis + "<|start|>assistant<|channel|>commentary<|message|>Checking."
             "<|end|>" + gpt_oss(*WEATHER), (WEATHER,)),
        Case(f, "no_call", analysis + "<|start|>assistant<|channel|>final<|message|>It is 4.<|return|>", ()),
        Case(f, "call_in_analysis_channel", "<|channel|>analysis to=functions.get_weather <|constrain|>json"
             '<|message|>{"city": "Paris", "days": 3}<|call|>', (WEATHER,)),
        Case(f, "builtin_recipient", '<|channel|>analysis to=browser.search<|message|>{"query": "x"}<|call|>', ()),
        Case(f, "invalid_json", analysis + gpt_oss(*WEATHER).replace('"Paris"', "Paris"), (), 1, well_formed=False,
             vllm_calls=(("get_weather", '{"city": Paris, "days": 3}'),)),
        Case(f, "unterminated", analysis + gpt_oss(*WEATHER)[:-len("<|call|>")], (), 1, well_formed=False,
             vllm_calls=(WEATHER,)),
    ]


def _gemma() -> list[Case]:
    f, call = "gemma", gemma(*WEATHER)
    return _common(f, gemma, join="") + [
        Case(f, "reasoning_then_call", "<|channel>thought\nweather?<channel|>" + call, (WEATHER,)),
        Case(f, "quoted_keys", '<|tool_call>call:get_weather{<|"|>city<|"|>:<|"|>Paris<|"|>,days:3}<tool_call|>',
             (WEATHER,)),
        Case(f, "no_call", "The answer is {4}.", ()),
        Case(f, "call_inside_reasoning", "<|channel>thought\nmaybe " + call + "<channel|>The answer is 4.", (),
             well_formed=False, vllm_calls=(WEATHER,)),
        Case(f, "unterminated", call[:-len("<tool_call|>")], (), 1, well_formed=False, vllm_calls=(WEATHER,)),
        Case(f, "unclosed_string", '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>', (), 1,
             well_formed=False, vllm_calls=(("get_weather", {"city": "Paris"}),)),
        Case(f, "bare_values_without_schema", gemma("log", {"entry": {"n": 3, "ok": True, "x": None}}),
             (("log", {"entry": {"n": 3, "ok": True, "x": None}}),), well_formed=False,
             vllm_calls=(("log", {"entry": {"n": "3", "ok": "true", "x": "null"}}),)),
    ]


CASES: list[Case] = [c for build in (_qwen3_coder, _llama3_json, _mistral, _deepseek_v3, _glm45, _gpt_oss, _gemma)
                     for c in build()]


def cases(family: str) -> list[Case]:
    return [c for c in CASES if c.family == family]
