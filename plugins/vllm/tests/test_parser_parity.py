"""Parity of toolrl's model-family tool parsers with vLLM's own parsers for those families.

Every output of the shared corpus (:mod:`toolrl.testing.parser_corpus`) goes through vLLM's serving
path for the family (``ParserManager.get_parser``: its reasoning parser, then its tool parser, as
``--tool-call-parser`` and ``--reasoning-parser`` would compose them) and through toolrl's parser.
On every well-formed output both give the same calls (names and argument objects); on the others
vLLM gives the calls the corpus records for it, so a change in either parser shows up here and in
docs/models.md. The tokenizer is the real Qwen one with the family's special tokens added (vLLM's
parsers look their markers up in the vocabulary); gpt-oss goes through vLLM's harmony parser on the
harmony encoding's token ids.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

pytest.importorskip("vllm")

from toolrl import model_sources  # noqa: E402
from toolrl.plugins import get_plugins  # noqa: E402
from toolrl.testing.parser_corpus import CASES, FAMILIES, TOOLS, Case  # noqa: E402

# vLLM's --tool-call-parser and --reasoning-parser for each family, and the special tokens its
# tokenizer has (the mistral parser reads the v11+ format when the vocabulary has [ARGS]).
VLLM_PARSERS: dict[str, tuple[str, str | None]] = {
    "qwen3_coder": ("qwen3_coder", "qwen3"),
    "llama3_json": ("llama3_json", None),
    "mistral": ("mistral", "mistral"),
    "deepseek_v3": ("deepseek_v3", "deepseek_v3"),
    "glm45": ("glm45", "glm45"),
    "gpt_oss": ("openai", "openai_gptoss"),
    "gemma": ("gemma4", "gemma4"),
}
SPECIAL_TOKENS: dict[str, list[str]] = {
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<think>", "</think>"],
    "llama3_json": ["<|python_tag|>", "<|eom_id|>", "<|eot_id|>"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"],
    "mistral_pre_v11": ["[TOOL_CALLS]"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>", "<think>", "</think>"],
    "glm45": ["<tool_call>", "</tool_call>", "<think>", "</think>", "<arg_key>", "</arg_key>", "<arg_value>",
              "</arg_value>", "<|observation|>"],
    "gemma": ["<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", '<|"|>', "<|tool_response>"],
    "gpt_oss": [],
}


@cache
def tokenizer(vocabulary: str) -> Any:
    """Wrapped as vLLM's server wraps a Hugging Face tokenizer (its vocabulary and special tokens read
    once, not at every parser's construction: 0.5 s each on a 150k vocabulary)."""
    from vllm.tokenizers.hf import get_cached_tokenizer

    tok = model_sources.qwen_tokenizer()
    tok.add_tokens(SPECIAL_TOKENS[vocabulary], special_tokens=True)
    return get_cached_tokenizer(tok)


def vllm_calls(case: Case) -> tuple[tuple[str, Any], ...]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    tool_parser, reasoning_parser = VLLM_PARSERS[case.family]
    vocabulary = "mistral_pre_v11" if case.family == "mistral" and not case.mistral_v11 else case.family
    tok = tokenizer(vocabulary)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                    tool_choice="auto")
    if case.family == "gpt_oss":
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

        token_ids = get_encoding().encode(case.text, allowed_special="all")
    else:
        token_ids = tok.encode(case.text)
    parser_cls = ParserManager.get_parser(tool_parser_name=tool_parser, reasoning_parser_name=reasoning_parser,
                                          enable_auto_tools=True, is_harmony=case.family == "gpt_oss")
    _, _, calls = parser_cls(tok, TOOLS).parse(case.text, request, enable_auto_tools=True,
                                               model_output_token_ids=token_ids)
    return tuple((c.name, _arguments(c.arguments)) for c in calls or ())


def _arguments(text: str) -> Any:
    """vLLM's arguments string decoded; it passes arguments that are not JSON on as they are."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def toolrl_calls(case: Case) -> tuple[tuple[str, Any], ...]:
    parser = get_plugins().load_part("tool_parsers", case.family)()
    parser.bind_tools(TOOLS)
    return tuple((c.name, c.arguments) for c in parser.parse(case.text).calls)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}-{c.name}" for c in CASES])
def test_same_calls_as_vllm(case: Case) -> None:
    got = vllm_calls(case)
    assert toolrl_calls(case) == case.calls
    if case.well_formed:
        assert got == case.calls, "a well-formed output must give vLLM's calls"
    else:
        assert got == (case.calls if case.vllm_calls is None else case.vllm_calls), \
            "vLLM's reading of this output changed: update the corpus and docs/models.md"


def test_every_family_has_well_formed_and_malformed_cases() -> None:
    for family in FAMILIES:
        kinds = {c.well_formed for c in CASES if c.family == family}
        assert kinds == {True, False}, family
