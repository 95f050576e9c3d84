import json
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolrl.parsers.bounded_json import MAX_DEPTH, MAX_NUMBER_CHARS
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



def test_each_call_is_parsed_on_its_own():
    """A broken call reads its tags as plain text: it ends at its own </tool_call> (issue 24)."""
    broken = '<tool_call>{"name": "f", "arguments": {"x": "oops}}</tool_call>'
    out = hermes.parse((broken + call("g", y=1)) * 2 + ' and "an odd quote')
    assert [c.name for c in out.calls] == ["g", "g"] and [e.raw for e in out.errors] == [broken, broken]
    assert out.content == 'and "an odd quote'
    # Even a </tool_call> inside the broken call's own string ends it; the rest is content and a stray.
    out = hermes.parse('<tool_call>{"name": "p", "arguments": {"code": "print(\'</tool_call>\')"</tool_call>ok')
    assert out.calls == [] and [e.raw for e in out.errors] == [
        '<tool_call>{"name": "p", "arguments": {"code": "print(\'</tool_call>', "</tool_call>"]
    assert "stray" in out.errors[1].message and out.content == "')\"ok"
    # Valid JSON still reads tags inside its strings as data.
    out = hermes.parse(call("p", code="print('</tool_call><tool_call>')") + "ok")
    assert out.calls[0].arguments == {"code": "print('</tool_call><tool_call>')"} and out.content == "ok"


broken_json = st.lists(st.sampled_from(['{', '}', '"', '\\', ':', ',', '[', ']', ' ', '\n', 'x', '1', '"name"',
                                        '"f"', '"arguments"', '{}', '<', '>', '/']), max_size=25).map("".join)
prose = st.lists(st.sampled_from(['"', "'", "\\", "{", "}", " ", "a", "<", ">", "\n"]), max_size=15).map("".join)


@settings(max_examples=500, deadline=None)
@given(broken_json, st.booleans(), prose)
def test_a_broken_call_never_takes_the_next_call_or_the_prose(body, terminated, after):
    """Whatever the JSON of a call without tags in it, the valid call after it comes back whole and
    the prose after that stays content."""
    text = "<tool_call>" + body + ("</tool_call>" if terminated else "") + call("g", y=1) + after
    out = hermes.parse(text)
    assert out.calls[-1].name == "g" and out.calls[-1].arguments == {"y": 1}
    assert len(out.calls) + len(out.errors) == 2
    assert out.content == after.strip()


def test_non_finite_numbers_are_errors():
    for number in ("1e999", "-1e999", "1E+400", "[1, 2e308, 3e308]"):
        out = hermes.parse('<tool_call>{"name": "f", "arguments": {"x": ' + number + "}}</tool_call>")
        assert out.calls == [] and "out of range (not a finite number)" in out.errors[0].message, number
    out = hermes.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1e999}"}</tool_call>')
    assert out.errors[0].message == ("invalid JSON in the arguments of tool call to 'f': "
                                     "the number 1e999 is out of range (not a finite number)")
    out = hermes.parse('<tool_call>{"name": "f", "arguments": {"x": 1e-400}}</tool_call>')
    assert out.calls[0].arguments == {"x": 0.0}  # underflow is finite


# The routes an environment using calculator and code_interpreter configures (the parser has none).
ROUTES = {"tags": {"calculator": {"tool": "calculator", "argument": "expression"}},
          "fences": {"python": {"tool": "code_interpreter", "argument": "code"}}}


def test_tags_parser():
    tags = TagParser(**ROUTES)
    text = "Compute <calculator>2*3</calculator> then\n```python\nprint(1)\n```\nand <calculator>4"
    out = tags.parse(text)
    assert [(c.name, c.arguments) for c in out.calls] == [
        ("calculator", {"expression": "2*3"}), ("code_interpreter", {"code": "print(1)"})]
    assert len(out.errors) == 1 and "unterminated" in out.errors[0].message
    assert "</calculator>" in tags.stop_strings and "```\n" in tags.stop_strings
    assert "```python\n".find("```\n") == -1  # the fence stop string does not fire on the opening fence
    assert tags.format_inline_result(ToolResponse(text="6")) == "\n```output\n6\n```\n"



def test_tags_parser_reads_crlf_fences():
    tags = TagParser(**ROUTES)
    out = tags.parse("Run:\r\n```python\r\nx = 2\r\nprint(x)\r\n```\r\nthen ```python \r\nprint(3)```")
    assert [c.arguments for c in out.calls] == [{"code": "x = 2\nprint(x)"}, {"code": "print(3)"}]
    assert out.errors == [] and out.content == "Run:\r\n\r\nthen"
    assert "```\r\n" in tags.stop_strings and "```python\r\n".find("```\r\n") == -1


def test_tags_parser_runs_calls_inside_think():
    """Intended: inline calls belong to the reasoning (see tags.py); think tags stay in the content."""
    out = TagParser(**ROUTES).parse("<think>so <calculator>6*7</calculator></think>42")
    assert [c.arguments for c in out.calls] == [{"expression": "6*7"}]
    assert out.content == "<think>so </think>42"

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


def test_tags_parser_has_no_routes_by_default():
    """The core names no plugin's tool: without routes nothing is a call."""
    tags = TagParser()
    assert tags.stop_strings == []
    out = tags.parse("<calculator>2*3</calculator>\n```python\nprint(1)\n```\n")
    assert out.calls == [] and out.errors == []


def test_deep_nesting_is_an_error_for_the_model():
    # ~1000 levels is ~500 Qwen tokens: the stdlib decoder raised RecursionError here.
    out = hermes.parse("<tool_call>" + "[" * 1000 + "</tool_call>")
    assert out.calls == [] and len(out.errors) == 1 and "deeper than 64" in out.errors[0].message
    def nested(levels):  # the call object and its arguments are two levels
        return call("f", x=json.loads("[" * (levels - 2) + "]" * (levels - 2)))

    assert hermes.parse(nested(MAX_DEPTH)).calls[0].name == "f"
    assert "deeper than 64" in hermes.parse(nested(MAX_DEPTH + 1)).errors[0].message
    nested_string = json.dumps({"name": "f", "arguments": "[" * 5000})  # string-encoded arguments too
    message = hermes.parse("<tool_call>" + nested_string + "</tool_call>").errors[0].message
    assert message == "invalid JSON in the arguments of tool call to 'f': nested deeper than 64 levels"


def test_huge_numbers_and_non_json_constants_are_errors():
    for digits in (4301, 100_000):  # past Python's int-string limit the stdlib raised ValueError
        out = hermes.parse('<tool_call>{"name": "f", "arguments": {"x": ' + "7" * digits + "}}</tool_call>")
        assert out.calls == [] and "number longer than 1000" in out.errors[0].message
    big = "9" * MAX_NUMBER_CHARS
    assert hermes.parse(call("f", x=int(big))).calls[0].arguments == {"x": int(big)}
    assert hermes.parse(call("f", x=float("1e308"))).calls[0].arguments == {"x": 1e308}
    for constant in ("NaN", "Infinity", "-Infinity"):
        out = hermes.parse('<tool_call>{"name": "f", "arguments": {"x": ' + constant + "}}</tool_call>")
        assert out.calls == [] and "is not a JSON value" in out.errors[0].message


def test_tags_inside_json_strings_are_data():
    code = 'a = "<tool_call>"; b = "</tool_call>"; c = "<think>"; d = "</think>"'
    out = hermes.parse("Run it.\n" + call("python", code=code) + "\nok")
    assert out.errors == [] and [c.arguments for c in out.calls] == [{"code": code}]
    assert out.content == "Run it.\n\nok"
    # A </think> in an argument inside a reasoning block does not end the block.
    out = hermes.parse("<think>" + call("x", text="</think>") + " still thinking</think>" + call("y"))
    assert [c.name for c in out.calls] == ["y"] and out.errors == []
    # A prompt-opened block: the first </think> outside JSON strings closes it.
    out = hermes.parse(call("x", text="</think>") + "</think>" + call("y"))
    assert [c.name for c in out.calls] == ["y"]


def test_broken_json_falls_back_to_the_tags_as_text():
    # A string that never closes: the first </tool_call> ends the call, the rest is content.
    out = hermes.parse('<tool_call>{"name": "f", "arguments": {"x": "oops}}</tool_call> after')
    assert out.calls == [] and len(out.errors) == 1 and "invalid JSON" in out.errors[0].message
    assert out.content == "after"
    # A tag outside JSON strings ends an unterminated call, so reasoning after it stays reasoning.
    out = hermes.parse('<tool_call>{"name": "f"<think>' + call("g") + "</think>done")
    assert out.calls == [] and len(out.errors) == 1 and "unterminated" in out.errors[0].message
    # Extra text after the JSON object.
    out = hermes.parse('<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>')
    assert "Extra data" in out.errors[0].message


def test_invalid_bytes_are_parsed_not_raised():
    """A call whose arguments hold a lone surrogate (bytes decoded with ``surrogateescape``, or the
    escape) is a parse error: UTF-8 cannot encode it. Replaced bytes are text."""
    raw = b'<tool_call>{"name": "f", "arguments": {"x": "\xff\xfe"}}</tool_call>\xc3'
    assert [c.name for c in hermes.parse(raw.decode("utf-8", "replace")).calls] == ["f"]
    for text in (raw.decode("utf-8", "surrogateescape"), call("f", x="\ud800")):
        out = hermes.parse(text)
        assert out.calls == [] and ["lone surrogate" in e.message for e in out.errors] == [True]


pieces = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', ":",
                          '"arguments"', "[", "]", ",", '"', "\\", "calculator", "1+1", "\n", " ",
                          "<calculator>", "</calculator>", "```python\n", "```\n", "null", "{}", "NaN"])
tag_text = st.lists(st.sampled_from(list('<>/"\\{}[] tkihnolc_:x\n') + [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "\\u00e9", "\\ud800", "\udcff"]), max_size=30).map("".join)
deep = st.integers(MAX_DEPTH - 2, 3000).flatmap(lambda d: st.sampled_from(["[" * d, "{\"a\":" * d, "[" * d + "]" * d]))
huge = st.integers(1, 6000).map(lambda k: "9" * k)
well_formed = st.builds(lambda name, arg: call(name, arg=arg), st.sampled_from(["f", "python"]),
                        st.one_of(tag_text, st.integers(), st.floats(allow_nan=False)))
invalid_bytes = st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape"))
fuzz_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(pieces, deep, huge, well_formed, invalid_bytes, tag_text), max_size=30).map("".join),
)
FUZZ_EXAMPLES = int(os.environ.get("TOOLRL_FUZZ_EXAMPLES", "1500"))  # 100000 for the full run


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fuzz_text)
def test_parsers_never_raise(text):
    for parser in (hermes, TagParser(**ROUTES)):
        out = parser.parse(text)
        for c in out.calls:
            assert isinstance(c.arguments, dict)
            json.dumps(c.arguments, allow_nan=False)  # bounded, finite, serialisable
        json.dumps(out.model_dump())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=10), tag_text),
                                max_size=3), min_size=1, max_size=4))
def test_well_formed_calls_round_trip(argument_sets):
    """Whatever the string arguments hold (tags, quotes, escapes), each call comes back whole; one
    holding a lone surrogate, which UTF-8 cannot encode, is its own parse error."""
    text = "".join(call("f", **{"a": a}) for a in argument_sets)
    out = hermes.parse(text)
    encodable = [a for a in argument_sets if _utf8(json.dumps(a, ensure_ascii=False))]
    assert [c.arguments for c in out.calls] == [{"a": a} for a in encodable]
    assert len(out.errors) == len(argument_sets) - len(encodable)


def _utf8(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_hundred_thousand_fuzzed_inputs_raise_nothing():
    """Bulk fuzz (hypothesis above shrinks failures; this covers volume): 100k inputs built from
    tag fragments, JSON fragments and random characters."""
    rng = random.Random(1234)
    fragments = [call(expression="1+1"), "<tool_call>", "</tool_call>", "<think>", "</think>", '{"name": "calculator", "arguments": ',
                 '{"expression": "1+1"}', "}", "{", '"', "\\", "<calculator>", "</calculator>", "```python\n",
                 "```\n", "[1]", "null", "\n", "é", "\x00"]
    tags = TagParser(**ROUTES)
    calls = errors = 0
    for _ in range(100_000):
        text = "".join(rng.choice(fragments) if rng.random() < 0.8 else chr(rng.randrange(1, 0x3000))
                       for _ in range(rng.randrange(0, 12)))
        out = hermes.parse(text)
        tags.parse(text)
        calls += len(out.calls)
        errors += len(out.errors)
    assert calls > 1000 and errors > 1000  # the fuzzer reaches both outcomes
