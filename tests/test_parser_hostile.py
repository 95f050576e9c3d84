"""Issue 36: the holes hostile inputs still found in the tool-call parsers and ``toolrl parse``.

The rule: a parser's failure is one call's error and never another call's loss. Each case below is a
malformed or tricky call next to valid ones; the valid calls must come back whole and the bad one as
its own parse error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _dists import run_toolrl
from toolrl.parsers import ToolParser
from toolrl.plugins import get_plugins
from toolrl.testing.parser_corpus import TOOLS


def parser(family: str) -> ToolParser:
    p = get_plugins().load_part("tool_parsers", family)()
    p.bind_tools(TOOLS)
    return p


def one_error_line(out: Any, exit_code: int, *fragments: str) -> None:
    assert out.returncode == exit_code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- JSON that decodes to what UTF-8 cannot hold ----------------------------------------------------

LONE = '"\\ud800"'  # JSON text: a high surrogate without its low half
PAIR = '"\\ud83d\\ude00"'  # a pair: one character (U+1F600)


@pytest.mark.parametrize("where", ["value", "key", "name"])
def test_a_lone_surrogate_escape_is_that_calls_error(where: str) -> None:
    bad = {"value": '{"name": "f", "arguments": {"x": ' + LONE + "}}",
           "key": '{"name": "f", "arguments": {' + LONE + ": 1}}",
           "name": '{"name": ' + LONE + ', "arguments": {}}'}[where]
    good = '{"name": "g", "arguments": {"y": ' + PAIR + ', "z": "\\\\ud800"}}'  # an escaped backslash: text
    out = parser("hermes").parse(f"<tool_call>{bad}</tool_call><tool_call>{good}</tool_call>")
    assert [(c.name, c.arguments) for c in out.calls] == [("g", {"y": "\U0001f600", "z": "\\ud800"})]
    assert len(out.errors) == 1 and "lone surrogate" in out.errors[0].message
    json.dumps(out.model_dump(), ensure_ascii=False).encode("utf-8")  # what traces write


# -- toolrl parse ---------------------------------------------------------------------------------


def test_deeply_nested_options_are_one_error_line() -> None:
    deep = "[" * 20_000 + "]" * 20_000
    one_error_line(run_toolrl("parse", "--options", deep, "-", stdin=""), 2, "--options", "nested deeper")


def test_a_hermes_call_whose_json_decodes_keeps_its_tags_as_data() -> None:
    """JSON that decodes but is no valid call (no name, a lone surrogate) still ends where its strings
    say: a ``<think>`` in one of them opens no reasoning that would hide the next call."""
    valid = '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    for bad in ('{"nam": "<tool_call><think>", "arguments": {}}',
                '{"name": "f", "arguments": {"a": "<tool_call><think>' + LONE[1:-1] + '"}}'):
        out = parser("hermes").parse(f"<tool_call>{bad}</tool_call>{valid}")
        assert [c.name for c in out.calls] == ["g"] and len(out.errors) == 1, out
        assert out.errors[0].raw == f"<tool_call>{bad}</tool_call>"


# -- one bad call among good ones -------------------------------------------------------------------


def calls_and_errors(family: str, text: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    out = parser(family).parse(text)
    return [(c.name, c.arguments) for c in out.calls], [e.raw for e in out.errors]


def deepseek_call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"


def test_deepseek_reads_each_call_of_a_block_on_its_own() -> None:
    bad = deepseek_call("get_weather", '{"city": Paris}')
    text = ("<｜tool▁calls▁begin｜>" + deepseek_call("get_time", "{}") + "\n" + bad + "\nstray\n"
            + deepseek_call("get_weather", '{"city": "Oslo"}') + "<｜tool▁calls▁end｜>")
    calls, errors = calls_and_errors("deepseek_v3", text)
    assert calls == [("get_time", {}), ("get_weather", {"city": "Oslo"})]
    assert errors == [bad, "stray"]


# A format's own markers written inside an argument: data, not the end of the call.
MARKER_IN_VALUE = {
    "qwen3_coder": "<tool_call>\n<function=python>\n<parameter=code>\nprint('<tool_call>', '</tool_call>')\n"
                   "</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>python\n<arg_key>code</arg_key>\n<arg_value>print('<tool_call>', '</tool_call>')"
             "</arg_value>\n</tool_call>",
    "deepseek_v3": "<｜tool▁calls▁begin｜>" + deepseek_call(
        "python", json.dumps({"code": "print('<｜tool▁call▁end｜>', '<｜tool▁calls▁end｜>')"}, ensure_ascii=False))
        + "<｜tool▁calls▁end｜>",
    "llama3_json": '<|python_tag|>{"name": "python", "parameters": {"code": "print(\'<|python_tag|>\')"}}',
}
CODE_IN_VALUE = {"qwen3_coder": "print('<tool_call>', '</tool_call>')", "glm45": "print('<tool_call>', '</tool_call>')",
                 "deepseek_v3": "print('<｜tool▁call▁end｜>', '<｜tool▁calls▁end｜>')",
                 "llama3_json": "print('<|python_tag|>')"}


@pytest.mark.parametrize("family", sorted(MARKER_IN_VALUE))
def test_a_marker_inside_an_argument_is_data(family: str) -> None:
    call = MARKER_IN_VALUE[family]
    calls, errors = calls_and_errors(family, "Running it.\n" + call + "\n" + call)
    assert calls == [("python", {"code": CODE_IN_VALUE[family]})] * 2 and errors == []
    if family != "llama3_json":  # without the tag, llama reads JSON objects out of prose
        assert parser(family).parse("Running it.\n" + call).content == "Running it."


UNCLOSED_VALUE = {"qwen3_coder": "<tool_call>\n<function=python>\n<parameter=code>\nx = 1\n</function>\n</tool_call>",
                  "glm45": "<tool_call>python\n<arg_key>code</arg_key>\n<arg_value>x = 1\n</tool_call>"}


@pytest.mark.parametrize("family", sorted(UNCLOSED_VALUE))
def test_an_unclosed_value_does_not_swallow_the_next_call(family: str) -> None:
    """A value that never closes is no data region: the block ends at its closing marker."""
    valid = MARKER_IN_VALUE[family]
    calls, errors = calls_and_errors(family, UNCLOSED_VALUE[family] + valid + UNCLOSED_VALUE[family] + valid)
    assert calls == [("python", {"code": CODE_IN_VALUE[family]})] * 2
    assert errors == [UNCLOSED_VALUE[family]] * 2


def test_mistral_reads_each_item_of_a_pre_v11_list_on_its_own() -> None:
    text = ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": 5}, '
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    calls, errors = calls_and_errors("mistral", text)
    assert calls == [("get_time", {}), ("get_weather", {"city": "Oslo"})] and errors == ['{"name": 5}']


def test_mistral_v13_writes_a_space_after_args() -> None:
    text = '[TOOL_CALLS]get_weather[ARGS] {"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]\n{}'
    assert calls_and_errors("mistral", text) == ([("get_weather", {"city": "Oslo"}), ("get_time", {})], [])


@pytest.mark.parametrize("recipient", ["to=functions.", "to="])
def test_gpt_oss_call_without_a_function_name_is_an_error(recipient: str) -> None:
    bad = f"<|start|>assistant<|channel|>commentary {recipient} <|message|>{{}}<|call|>"
    good = '<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>'
    calls, errors = calls_and_errors("gpt_oss", bad + good)
    assert calls == [("get_time", {})] and errors == [bad]


# -- llama: the tag in a string, separators, end tokens ---------------------------------------------


def test_llama_python_tag_inside_a_json_string_is_data() -> None:
    call = '{"name": "python", "parameters": {"code": "print(\'<|python_tag|>\')"}}'
    calls, errors = calls_and_errors("llama3_json", "Let me run it. " + call)
    assert calls == [("python", {"code": "print('<|python_tag|>')"})] and errors == []
    # A real tag after it still opens the call turn; one in JSON that does not decode is a tag.
    out = parser("llama3_json").parse(call + ' <|python_tag|>{"name": "get_time", "parameters": {}}')
    assert [c.name for c in out.calls] == ["python", "get_time"] and out.errors == []
    out = parser("llama3_json").parse('{"x": <|python_tag|>{"name": "get_time", "parameters": {}}')
    assert [c.name for c in out.calls] == ["get_time"] and out.content == '{"x":'


def test_llama_separators_and_end_tokens_are_not_content() -> None:
    weather = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    time = '{"name": "get_time", "parameters": {}}'
    for text in (f"{weather}; {time}<|eot_id|>", f"<|python_tag|>{weather}; {time}<|eom_id|>"):
        out = parser("llama3_json").parse(text)
        assert [c.name for c in out.calls] == ["get_weather", "get_time"] and out.content == "", text


END_TOKENS = {"llama3_json": "<|eom_id|>", "deepseek_v3": "<｜end▁of▁sentence｜>", "glm45": "<|observation|>",
              "gemma": "<|tool_response>", "qwen3_coder": "<|im_end|>", "mistral": "</s>"}


@pytest.mark.parametrize("family", sorted(END_TOKENS))
def test_a_familys_end_token_is_not_content(family: str) -> None:
    from toolrl.testing import parser_corpus as corpus

    render = getattr(corpus, family)
    call = render(("get_time", {})) if family == "deepseek_v3" else render("get_time", {})
    out = parser(family).parse("Checking." + call + END_TOKENS[family])
    assert [c.name for c in out.calls] == ["get_time"] and out.content == "Checking."


# -- a parser that raises or loops ------------------------------------------------------------------

FAULTY_PARSERS = """
from toolrl import hookimpl
from toolrl.parsers import ToolParser


class Raises(ToolParser):
    name = "raises"

    def parse(self, text):
        raise RuntimeError("the plugin broke\\non two lines")


class Loops(ToolParser):
    name = "loops"

    def parse(self, text):
        while True:
            pass


class ReturnsText(ToolParser):
    name = "returns_text"

    def parse(self, text):
        return text


@hookimpl
def register_tool_parsers(register):
    register(Raises)
    register(Loops)
    register(ReturnsText)
"""


@pytest.fixture(scope="module")
def faulty_plugin(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from _dists import make_dist

    path = tmp_path_factory.mktemp("faulty")
    make_dist(path, "toolrl-plugin-faulty-parsers", "faulty", "faulty_parsers_plugin", FAULTY_PARSERS)
    return path


def test_a_parser_that_raises_is_one_error_line(faulty_plugin: Any) -> None:
    out = run_toolrl("parse", "--parser", "raises", "-", stdin="hi", path=faulty_plugin)
    one_error_line(out, 1, "parser 'raises' failed: RuntimeError: the plugin broke on two lines")
    out = run_toolrl("parse", "--parser", "returns_text", "-", stdin="hi", path=faulty_plugin)
    one_error_line(out, 1, "parser 'returns_text' returned str, not a ParseResult")


def test_a_parser_that_loops_is_stopped_by_the_time_limit(faulty_plugin: Any) -> None:
    import time

    start = time.monotonic()
    out = run_toolrl("parse", "--parser", "loops", "--timeout", "1", "-", stdin="hi", path=faulty_plugin, timeout=60)
    one_error_line(out, 1, "parser 'loops' did not finish within 1 s")
    assert time.monotonic() - start < 30 and out.stdout == ""


async def test_a_parser_that_raises_in_the_rollout_is_that_turns_parse_error() -> None:
    """The trajectory goes on: the model reads the error, and the next turn parses as usual."""
    from toolrl.config import RewardConfig, RolloutConfig
    from toolrl.model_sources import qwen_tokenizer
    from toolrl.parsers.hermes import HermesParser
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout import RolloutContext, Route, run_trajectory
    from toolrl.schemas import Sample
    from toolrl.testing import ScriptedEngine

    class Fragile(HermesParser):
        name = "fragile"

        def parse(self, text: str) -> Any:
            if "boom" in text:
                raise RuntimeError("cannot read boom")
            return super().parse(text)

    tokenizer = qwen_tokenizer("qwen2_5")
    engine = ScriptedEngine(tokenizer, ["boom", "The answer is 4."])
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=RolloutConfig(), routes={None: Route({}, 4, Fragile(), [], RewardConfig())})
    sample = Sample(prompt=[{"role": "user", "content": "2+2?"}], ground_truth="4")
    traj = await run_trajectory(ctx, sample, 0, "t1", seed=0)
    assert traj.termination == "answered" and traj.final_response.startswith("The answer is 4.")
    assert [e.message for e in traj.parse_errors] == ["the tool-call parser 'fragile' failed: RuntimeError: cannot read boom"]
    assert "cannot read boom" in tokenizer.decode(engine.calls[1].prompt_ids)  # the model was told


async def test_a_parser_that_hangs_or_exits_in_the_rollout_costs_its_turns_not_the_run() -> None:
    """A parser past rollout.parser_timeout_s is that turn's error and is handed no more text (its thread
    cannot be stopped); SystemExit from a parser is an error like any other exception."""
    import threading
    import time

    from toolrl.config import RewardConfig, RolloutConfig
    from toolrl.model_sources import qwen_tokenizer
    from toolrl.parsers.hermes import HermesParser
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout import RolloutContext, Route, run_trajectory
    from toolrl.schemas import Sample
    from toolrl.testing import ScriptedEngine

    release = threading.Event()

    class Hangs(HermesParser):
        name = "hangs"
        texts: list[str] = []

        def parse(self, text: str) -> Any:
            self.texts.append(text)
            if "hang" in text:
                release.wait(60)
            return super().parse(text)

    class Exits(HermesParser):
        name = "exits"

        def parse(self, text: str) -> Any:
            if "exit" in text:
                raise SystemExit(3)
            return super().parse(text)

    tokenizer = qwen_tokenizer("qwen2_5")
    sample = Sample(prompt=[{"role": "user", "content": "2+2?"}], ground_truth="4")

    async def run(parser: HermesParser, script: list[str]) -> Any:
        engine = ScriptedEngine(tokenizer, script)
        ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                             config=RolloutConfig(parser_timeout_s=0.5),
                             routes={None: Route({}, 2, parser, [], RewardConfig())})  # a turn per text
        return await run_trajectory(ctx, sample, 0, "t1", seed=0), engine

    try:
        hangs = Hangs()
        start = time.monotonic()
        traj, engine = await run(hangs, ["hang", "The answer is 4."])
        assert time.monotonic() - start < 10
        assert [e.message for e in traj.parse_errors] == [
            "the tool-call parser 'hangs' failed: it did not finish within 0.5 s (rollout.parser_timeout_s)",
            "the tool-call parser 'hangs' failed: it ran past its 0.5 s limit earlier in this run and still runs"]
        assert "did not finish within 0.5 s" in tokenizer.decode(engine.calls[1].prompt_ids)  # the model was told
        assert len(hangs.texts) == 1  # the second turn was not handed to the stuck parser
    finally:
        release.set()
    traj, _ = await run(Exits(), ["exit", "The answer is 4."])
    assert traj.termination == "answered" and traj.final_response.startswith("The answer is 4.")
    assert [e.message for e in traj.parse_errors] == ["the tool-call parser 'exits' failed: SystemExit: 3"]


async def test_a_cancel_that_arrives_as_the_parse_finishes_still_cancels() -> None:
    """The parse has finished on its thread and its result is queued for the loop when the trajectory is
    cancelled: the cancellation wins (Python 3.11's wait_for returned the result and dropped it)."""
    import asyncio
    import threading
    import time

    from toolrl.parsers import parse_within
    from toolrl.parsers.hermes import HermesParser

    parsed = threading.Event()

    class Quick(HermesParser):
        name = "quick"

        def parse(self, text: str) -> Any:
            try:
                return super().parse(text)
            finally:
                parsed.set()

    task = asyncio.ensure_future(parse_within(Quick(), "plain text", 10))
    await asyncio.sleep(0)  # the task starts the parse and waits for it
    assert parsed.wait(10)
    time.sleep(0.2)  # holding the loop: the thread's result is queued behind the cancel
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_flood_of_malformed_calls_reaches_the_model_as_a_few_errors_and_a_count() -> None:
    """20 000 unterminated <tool_call> tags in one turn are 5 error messages and one count for the model
    (and the trace), not 20 000 tool messages: the cap is in parse_within, so it holds for every parser."""
    from toolrl.config import RewardConfig, RolloutConfig
    from toolrl.model_sources import qwen_tokenizer
    from toolrl.parsers import MAX_REPORTED_ERRORS
    from toolrl.parsers.hermes import HermesParser
    from toolrl.renderers.chat import ChatRenderer
    from toolrl.rollout import RolloutContext, Route, run_trajectory
    from toolrl.schemas import Sample
    from toolrl.testing import ScriptedEngine

    tokenizer = qwen_tokenizer("qwen2_5")
    engine = ScriptedEngine(tokenizer, ["<tool_call>" * 20_000, "The answer is 4."])
    ctx = RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                         config=RolloutConfig(max_new_tokens=50_000, max_response_tokens=100_000),
                         routes={None: Route({}, 4, HermesParser(), [], RewardConfig())})
    sample = Sample(prompt=[{"role": "user", "content": "2+2?"}], ground_truth="4")
    traj = await run_trajectory(ctx, sample, 0, "t1", seed=0)
    assert traj.termination == "answered"
    messages = [e.message for e in traj.parse_errors]
    assert messages == ["unterminated tool call: missing </tool_call>"] * MAX_REPORTED_ERRORS + [
        f"{20_000 - MAX_REPORTED_ERRORS} more malformed tool calls not shown"]
    told = tokenizer.decode(engine.calls[1].prompt_ids[len(engine.calls[0].prompt_ids):])
    assert told.count("missing </tool_call>") == MAX_REPORTED_ERRORS and "19995 more malformed" in told
