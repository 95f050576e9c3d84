"""The model-family tool parsers: the shared corpus, the calls each family's chat template (trl's
``chat_templates``) renders read back, schema typing, the route binding its tools, and fuzzing (no
input raises; a call written in the family's syntax comes back whole)."""

from __future__ import annotations

import json
import os
import random
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolrl import model_sources
from toolrl.config import load_config
from toolrl.parsers import ToolParser
from toolrl.plugins import get_plugins
from toolrl.rollout.routes import build_routes
from toolrl.testing import parser_corpus as corpus
from toolrl.testing.parser_corpus import CASES, FAMILIES, SEARCH, TOOLS, TYPED, UNICODE, WEATHER, Case


def parser(family: str, tools: list[dict[str, Any]] | None = TOOLS) -> ToolParser:
    p = get_plugins().load_part("tool_parsers", family)()
    if tools is not None:
        p.bind_tools(tools)
    return p


def calls_of(p: ToolParser, text: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((c.name, c.arguments) for c in p.parse(text).calls)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}-{c.name}" for c in CASES])
def test_corpus(case: Case) -> None:
    out = parser(case.family).parse(case.text)
    assert tuple((c.name, c.arguments) for c in out.calls) == case.calls
    assert len(out.errors) == case.errors, [e.message for e in out.errors]
    assert all(e.message and e.raw for e in out.errors)
    if case.well_formed:
        assert case.vllm_calls is None, "a well-formed case must parse as vLLM parses it"


def test_content_keeps_the_text_around_calls() -> None:
    out = parser("qwen3_coder").parse("Checking.\n" + corpus.qwen3_coder(*WEATHER) + "\nDone.")
    assert out.content == "Checking.\n\nDone."
    out = parser("gpt_oss").parse("<|channel|>analysis<|message|>hm<|end|>" + corpus.gpt_oss(*WEATHER))
    assert out.content == "<|channel|>analysis<|message|>hm<|end|>"
    out = parser("llama3_json").parse("The set {1, 2}. " + corpus.llama3_json(*WEATHER) + " ok")
    assert out.content == "The set {1, 2}.  ok" and len(out.calls) == 1
    # A call inside reasoning is left in the content, untouched.
    text = "<think>" + corpus.glm45(*WEATHER) + "</think>answer"
    assert parser("glm45").parse(text).content == text


# -- what each family's chat template renders ----------------------------------------------------

TEMPLATES = {  # family: (trl template, the calls one assistant turn carries, arguments as a JSON string)
    "qwen3_coder": ("qwen3_6.jinja", [WEATHER, SEARCH, TYPED], False),
    "llama3_json": ("llama3_1.jinja", [UNICODE], False),
    "deepseek_v3": ("deepseekv3.jinja", [WEATHER, SEARCH, UNICODE], True),
    "glm45": ("glm4moe.jinja", [WEATHER, SEARCH, TYPED], False),
    "gpt_oss": ("gptoss.jinja", [SEARCH], False),
    "gemma": ("gemma4_v5.jinja", [WEATHER, SEARCH, TYPED], False),
}


@cache
def tokenizer() -> Any:
    return model_sources.qwen_tokenizer()


def rendered_turn(template: str, calls: list[corpus.Call], as_string: bool) -> str:
    """The assistant turn the template renders for ``calls``: the conversation with it, less the
    part it shares with the prompt (the generation prompt included)."""
    import trl

    tok = tokenizer()
    source = (Path(trl.__file__).parent / "chat_templates" / template).read_text()
    tool_calls = [{"id": f"call{i}", "type": "function",
                   "function": {"name": n, "arguments": json.dumps(a) if as_string else a}}
                  for i, (n, a) in enumerate(calls)]
    user = [{"role": "user", "content": "Weather in Paris?"}]
    full = tok.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                   chat_template=source, tokenize=False, tools=TOOLS)
    prompt = tok.apply_chat_template(user, chat_template=source, tokenize=False, tools=TOOLS,
                                     add_generation_prompt=True)
    shared = len(os.path.commonprefix([full, prompt]))
    if shared < len(prompt):  # the generation prompt opens reasoning the turn does not: cut at a marker's end
        shared = full.rfind(">", 0, shared) + 1
    return full[shared:]


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_template_rendered_calls_read_back(family: str) -> None:
    template, calls, as_string = TEMPLATES[family]
    turn = rendered_turn(template, calls, as_string)
    out = parser(family).parse(turn)
    assert [(c.name, c.arguments) for c in out.calls] == calls, turn
    assert out.errors == []


def test_stop_strings_and_end_of_call_tokens() -> None:
    expected = {  # the tokens after which a turn with calls waits for the results
        "qwen3_coder": ((), ("<|im_end|>",)), "llama3_json": (("<|eom_id|>",), ("<|eom_id|>", "<|eot_id|>")),
        "mistral": ((), ("</s>",)), "deepseek_v3": ((), ("<｜end▁of▁sentence｜>",)),
        "glm45": (("<|observation|>",), ("<|observation|>",)), "gpt_oss": (("<|call|>",), ("<|call|>",)),
        "gemma": (("<|tool_response>",), ("<|tool_response>",)),
    }
    for family in FAMILIES:
        p = parser(family)
        assert (tuple(p.stop_strings), p.end_of_call_tokens) == expected[family], family
    # Gemma's template writes <|tool_response> right after the calls: the model's next token.
    assert rendered_turn(*TEMPLATES["gemma"]).endswith("<tool_call|><|tool_response>")


def test_aliases_resolve() -> None:
    registry = get_plugins()
    for alias, family in {"qwen3_xml": "qwen3_coder", "llama3": "llama3_json", "glm47": "glm45",
                          "harmony": "gpt_oss", "gemma4": "gemma"}.items():
        assert registry.load_part("tool_parsers", alias) is registry.load_part("tool_parsers", family)


# -- typing values from the tools' schemas -------------------------------------------------------


def test_untyped_formats_keep_text_without_schemas() -> None:
    for family, render in (("qwen3_coder", corpus.qwen3_coder), ("glm45", corpus.glm45)):
        assert calls_of(parser(family, None), render(*TYPED)) == (
            ("configure", {"enabled": "true", "ratio": "0.25", "note": "null", "zip": "02139"}),)
    # Gemma's bare values are JSON without a schema; quoted ones stay strings.
    assert calls_of(parser("gemma", None), corpus.gemma(*TYPED)) == (TYPED,)


def test_schema_typing_rules() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}, "either": {"type": ["integer", "string"]}, "choice": {"enum": [1, 2]},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "number"}]}, "obj": {"type": "object"},
        "flag": {"type": "boolean"}}}}}]
    p = parser("qwen3_coder", tools)

    def typed(key: str, value: str) -> Any:
        return calls_of(p, corpus.qwen3_coder("f", {key: value}))[0][1][key]

    assert typed("n", "42") == 42 and typed("n", "4.5") == "4.5" and typed("n", "x") == "x"
    assert typed("n", "9" * 2000) == "9" * 2000  # past the number bound: text, for the tool to reject
    assert typed("either", "7") == 7 and typed("either", "seven") == "seven"
    assert typed("choice", "2") == 2 and typed("maybe", "null") is None and typed("maybe", "1e3") == 1000.0
    assert typed("maybe", "1e999") == "1e999"  # not finite: kept as text
    assert typed("obj", '{"a": [1]}') == {"a": [1]} and typed("obj", "[1]") == "[1]"
    assert typed("flag", "True") is True and typed("flag", "0") is False
    assert typed("unknown", "5") == "5"


async def test_routes_bind_their_tools_to_the_parser(tmp_path: Path) -> None:
    """The route's parser types values from the route's tools (faulty_tools.Echo: x is an integer)."""
    config = load_config(None, ["rollout.parser=qwen3_coder", "tools.entries=[{class_name: faulty_tools.Echo}]",
                                "reward.functions=[]"],
                         data={"data": {"train_files": ["train.jsonl"]}, "base_dir": str(tmp_path)})
    routes, tools = await build_routes(config)
    try:
        assert calls_of(routes[None].parser, corpus.qwen3_coder("echo", {"x": 5})) == (("echo", {"x": 5}),)
    finally:
        for tool in tools:
            await tool.close()


# -- fuzzing ----------------------------------------------------------------------------------------

MARKERS = {
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=f>", "<function=", "</function>", "<parameter=x>",
                    "<parameter=", "</parameter>", "<think>", "</think>"],
    "llama3_json": ["<|python_tag|>", "<|eom_id|>", '{"name": "f", "parameters": ', '{"name":', ";", "{", "}"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]", "f", '[{"name": "f", "arguments": {}}]', "[", "{"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>", "function", "\n```json\n", "\n```", "<think>", "</think>"],
    "glm45": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>",
              "</think>", "f"],
    "gpt_oss": ["<|start|>assistant", "<|channel|>commentary", "<|channel|>analysis", " to=functions.f",
                " to=browser.x", "<|constrain|>json", " json", "<|message|>", "<|call|>", "<|end|>", "<|return|>"],
    "gemma": ["<|tool_call>", "<tool_call|>", "call:f", "call:", "<|channel>", "<channel|>", '<|"|>', ":", ",",
              "{", "}", "[", "]", "true", "null"],
}
JSON_BITS = ['{"x": 1}', '"', "\\", "{", "}", "[", "]", ":", ",", "1e999", "NaN", "9" * 1200, "\n", " ", "é", "\udcff"]
fuzz_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(sorted({m for ms in MARKERS.values() for m in ms}) + JSON_BITS),
                       st.integers(60, 800).map(lambda d: "[" * d), st.integers(60, 400).map(lambda d: "{x:" * d),
                       st.text(max_size=8)), max_size=40).map("".join),
)
FUZZ_EXAMPLES = int(os.environ.get("TOOLRL_FUZZ_EXAMPLES", "1500"))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fuzz_text)
def test_family_parsers_never_raise(text: str) -> None:
    for family in FAMILIES:
        out = parser(family).parse(text)
        json.dumps(out.model_dump(), allow_nan=False)  # bounded, finite, serialisable


def test_seventy_thousand_fuzzed_inputs_raise_nothing() -> None:
    """Volume: 10k inputs per family from its own markers, JSON fragments and random characters."""
    rng = random.Random(2024)
    for family in FAMILIES:
        p = parser(family)
        good = corpus.cases(family)[0].text
        fragments = MARKERS[family] + JSON_BITS + [good]
        calls = errors = 0
        for _ in range(10_000):
            text = "".join(rng.choice(fragments) if rng.random() < 0.85 else chr(rng.randrange(1, 0x3000))
                           for _ in range(rng.randrange(0, 14)))
            out = p.parse(text)
            calls += len(out.calls)
            errors += len(out.errors)
        assert calls > 100 and errors > 100, family  # the fuzzer reaches both outcomes


# Strings with each family's markers and JSON's special characters; the XML formats' values cannot
# hold their own closing tag, Gemma's strings cannot hold its quote mark.
plain = st.lists(st.sampled_from(list('ab <>/{}[]":,\\\n\'é東') + ["<think>", "</think>", "[TOOL_CALLS]"]),
                max_size=12).map("".join)
values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), plain,
                                st.floats(allow_nan=False, allow_infinity=False, width=32)),
                      lambda children: st.one_of(st.lists(children, max_size=3),
                                                 st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True),
                                                                 children, max_size=3)), max_leaves=8)
arguments = st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), values, max_size=4)
JSON_RENDER = {"llama3_json": corpus.llama3_json, "mistral": corpus.mistral, "gpt_oss": corpus.gpt_oss,
               "deepseek_v3": lambda n, a: corpus.deepseek_v3((n, a)), "gemma": corpus.gemma}


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(arguments, min_size=1, max_size=3))
def test_calls_round_trip(argument_sets: list[dict[str, Any]]) -> None:
    """Whatever the values hold (markers, quotes, escapes, nesting), each call comes back whole."""
    for family, render in JSON_RENDER.items():
        if family == "gemma" and any('<|"|>' in json.dumps(a) for a in argument_sets):
            continue
        text = "\n".join(render(f"f{i}", a) for i, a in enumerate(argument_sets))
        if family == "llama3_json":
            text = "<|python_tag|>" + text.replace("\n", "; ")
        out = parser(family).parse(text)
        expected = [(f"f{i}", a) for i, a in enumerate(argument_sets)]
        assert [(c.name, c.arguments) for c in out.calls] == expected, (family, text)
        assert out.errors == []


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), plain, max_size=4),
                min_size=1, max_size=3))
def test_xml_string_values_round_trip(argument_sets: list[dict[str, str]]) -> None:
    for family, render in (("qwen3_coder", corpus.qwen3_coder), ("glm45", corpus.glm45)):
        text = "\n".join(render("f", a) for a in argument_sets)
        out = parser(family, None).parse(text)
        assert [c.arguments for c in out.calls] == argument_sets, (family, text)
