import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolrl.parsers.hermes import HermesParser
from toolrl.parsers.tags import TagParser
from toolrl.schemas import ToolResponse

hermes = HermesParser()


def call(name="calculator", **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_one_call_and_one_error():
    out = hermes.parse(call(expression="1+1") + "<tool_call>{bad")
    assert [c.name for c in out.calls] == ["calculator"]
    assert out.calls[0].arguments == {"expression": "1+1"}
    assert len(out.errors) == 1 and "unterminated" in out.errors[0].message


def test_several_calls_and_content_kept():
    out = hermes.parse("Let me compute.\n" + call(expression="2*3") + "\n" + call("search", q="x") + "\nDone.")
    assert [c.name for c in out.calls] == ["calculator", "search"]
    assert out.content == "Let me compute.\n\n\nDone."
    assert out.errors == []


def test_calls_inside_think_are_ignored():
    assert hermes.parse("<think>maybe " + call(expression="1") + "</think>no call").calls == []
    # A prompt-opened reasoning block closed in the response, and an unclosed one.
    assert hermes.parse("reasoning " + call() + "</think>answer").calls == []
    assert hermes.parse("<think>" + call() + " still thinking").calls == []
    out = hermes.parse("<think>a</think>" + call(expression="4"))
    assert out.calls[0].arguments == {"expression": "4"}


def test_malformed_calls_become_errors():
    cases = {
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "missing 'name'",
        '<tool_call>{"name": "x"}</tool_call>': "missing 'arguments'",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
        "<tool_call>{nope}</tool_call>": "invalid JSON",
        "text </tool_call>": "stray",
    }
    for text, expected in cases.items():
        out = hermes.parse(text)
        assert out.calls == [], text
        assert len(out.errors) == 1 and expected in out.errors[0].message, (text, out.errors)


def test_think_tags_inside_arguments_are_data():
    out = hermes.parse(call("xml", text="<think>a</think>") + call("xml", text="<think>"))
    assert [c.arguments["text"] for c in out.calls] == ["<think>a</think>", "<think>"]
    assert hermes.parse("<think>" + call("x", text="</think>") + " still thinking").calls == []


def test_string_encoded_arguments_and_close_tag_inside_string():
    out = hermes.parse('<tool_call>{"name": "c", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>')
    assert out.calls[0].arguments == {"expression": "1"}
    code = 'print("</tool_call>")'
    out = hermes.parse(call("python", code=code))
    assert out.errors == [] and out.calls[0].arguments == {"code": code}


def test_unterminated_call_before_next_call():
    out = hermes.parse('<tool_call>{"name": "a"' + call(expression="2"))
    assert len(out.calls) == 1 and len(out.errors) == 1


def test_tags_parser():
    tags = TagParser()
    text = "Compute <calculator>2*3</calculator> then\n```python\nprint(1)\n```\nand <calculator>4"
    out = tags.parse(text)
    assert [(c.name, c.arguments) for c in out.calls] == [
        ("calculator", {"expression": "2*3"}), ("code_interpreter", {"code": "print(1)"})]
    assert len(out.errors) == 1 and "unterminated" in out.errors[0].message
    assert "</calculator>" in tags.stop_strings and "```\n" in tags.stop_strings
    assert "```python\n".find("```\n") == -1  # the fence stop string does not fire on the opening fence
    assert tags.format_inline_result(ToolResponse(text="6")) == "\n```output\n6\n```\n"


def test_tags_parser_custom_routes_and_bad_options():
    tags = TagParser(tags={"search": {"tool": "web", "argument": "query"}}, fences={})
    assert tags.parse("<search>cats</search>").calls[0].arguments == {"query": "cats"}
    assert tags.stop_strings == ["</search>"]
    try:
        TagParser(tags={"x": {"tool": "t"}})
    except ValueError as exc:
        assert "argument" in str(exc)
    else:
        raise AssertionError("missing argument accepted")


pieces = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', ":",
                          '"arguments"', "[", "]", ",", '"', "\\", "calculator", "1+1", "\n", " ",
                          "<calculator>", "</calculator>", "```python\n", "```\n", "null", "{}"])
fuzz_text = st.one_of(st.text(max_size=200), st.lists(pieces, max_size=40).map("".join))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_text)
def test_parsers_never_raise(text):
    for parser in (hermes, TagParser()):
        out = parser.parse(text)
        for c in out.calls:
            assert isinstance(c.arguments, dict)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=10)), max_size=3),
                min_size=1, max_size=4))
def test_well_formed_calls_round_trip(argument_sets):
    text = "".join(call("f", **{"a": a}) for a in argument_sets)
    out = hermes.parse(text)
    assert [c.arguments for c in out.calls] == [{"a": a} for a in argument_sets]
    assert out.errors == []


def test_hundred_thousand_fuzzed_inputs_raise_nothing():
    """Bulk fuzz (hypothesis above shrinks failures; this covers volume): 100k inputs built from
    tag fragments, JSON fragments and random characters."""
    rng = random.Random(1234)
    fragments = [call(expression="1+1"), "<tool_call>", "</tool_call>", "<think>", "</think>", '{"name": "calculator", "arguments": ',
                 '{"expression": "1+1"}', "}", "{", '"', "\\", "<calculator>", "</calculator>", "```python\n",
                 "```\n", "[1]", "null", "\n", "é", "\x00"]
    tags = TagParser()
    calls = errors = 0
    for _ in range(100_000):
        text = "".join(rng.choice(fragments) if rng.random() < 0.8 else chr(rng.randrange(1, 0x3000))
                       for _ in range(rng.randrange(0, 12)))
        out = hermes.parse(text)
        tags.parse(text)
        calls += len(out.calls)
        errors += len(out.errors)
    assert calls > 1000 and errors > 1000  # the fuzzer reaches both outcomes
