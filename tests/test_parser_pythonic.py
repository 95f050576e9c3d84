"""The ``pythonic`` parser (toolrl.parsers.pythonic): BFCL's prompting-mode answers, Llama 3.2/4's
pythonic calls. Read as BFCL's decoder reads them, and never evaluated."""

from __future__ import annotations

import builtins
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from toolrl.parsers import parse_on_thread
from toolrl.parsers.pythonic import MAX_CHARS, PythonicParser
from toolrl.schemas import ParseResult
from toolrl.testing.parser_corpus import Call
from toolrl.testing.parsers import ParserConformance

# Text the fuzz makes ("1if") draws compile warnings; the parser silences them under its own file name,
# but pytest resets warning filters around each test.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")


def pythonic(calls: Sequence[Call]) -> str:
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls) + "]"


class TestPythonic(ParserConformance):
    parser_name = "pythonic"
    render = staticmethod(pythonic)


def parse(text: str) -> ParseResult:
    return PythonicParser().parse(text)


def calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = parse(text)
    assert out.errors == [], [e.message for e in out.errors]
    return [(c.name, c.arguments) for c in out.calls]


def test_single_and_parallel_calls() -> None:
    assert calls('[get_weather(city="Paris", unit="c")]') == [("get_weather", {"city": "Paris", "unit": "c"})]
    out = parse('[get_weather(city="Paris"), get_time(), search(query="x", limit=5)]')
    assert [(c.name, c.arguments) for c in out.calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {}), ("search", {"query": "x", "limit": 5})]
    assert out.content == "" and out.errors == []
    # BFCL adds the brackets a model leaves out.
    assert calls('get_weather(city="Paris"), get_time()') == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_dotted_names() -> None:
    assert calls("[math.factorial(number=5), a.b.c(x=1)]") == [("math.factorial", {"number": 5}),
                                                                ("a.b.c", {"x": 1})]


def test_values_nested_negative_bare_names_and_ellipsis() -> None:
    text = ('[f(d={"k": [1, (2, 3)], 1: None, "t": True}, n=-3, p=+2.5, e=-1e-3, unit=celsius, '
            'nothing=..., s="it\'s")]')
    assert calls(text) == [("f", {"d": {"k": [1, [2, 3]], "1": None, "t": True}, "n": -3, "p": 2.5,
                                  "e": -0.001, "unit": "celsius", "nothing": "...", "s": "it's"})]


def test_nested_calls_take_bfcls_forms() -> None:
    assert calls("[f(x=g(a=1, b=h(c=-2)), y=g(1, 2))]") == [
        ("f", {"x": {"g": {"a": 1, "b": {"h": {"c": -2}}}}, "y": "g(1, 2)"})]


def test_arithmetic_is_computed_on_numbers() -> None:
    assert calls("[f(a=2**10, b=3*4+1, c=7/2, d=7//2, e=7%3, g=-(1+2), h=1.5-0.5, i=2**-1)]") == [
        ("f", {"a": 1024, "b": 13, "c": 3.5, "d": 3, "e": 1, "g": -3, "h": 1.0, "i": 0.5})]
    for text, why in [("[f(x=1/0)]", "division by zero"), ('[f(x="a"+"b")]', "arithmetic is on numbers"),
                      ("[f(x=1e6**64)]", "arithmetic failed"), ("[f(x=(-8)**0.5)]", "not real"),
                      ("[f(x=1e999)]", "not finite"), ("[f(x=1000000**64*1000000**64*1000000**64)]", "too large")]:
        out = parse(text)
        assert not out.calls and len(out.errors) == 1 and why in out.errors[0].message, (text, out.errors)


def test_fenced_answers() -> None:
    for fence in ("```python\n{}\n```", "```\n{}\n```", "```json\n{}\n```", "\n\n  {}  \n"):
        out = parse(fence.format('[get_weather(city="Paris")]'))
        assert [c.name for c in out.calls] == ["get_weather"] and out.content == "" and not out.errors, fence


def test_prose_is_content() -> None:
    for text in ["The answer is 42.", "Hello", "42", "[1, 2, 3]", "[]", "", "Let me think (briefly) about it.",
                 "[see above] the answer is (a)."]:
        out = parse(text)
        assert out.content == text.strip() and not out.calls and not out.errors, (text, out)


def test_a_call_list_after_prose_is_read_and_the_prose_is_content() -> None:
    out = parse('Let me check.\n```python\n[get_weather(city="Paris")]\n```')
    assert [c.name for c in out.calls] == ["get_weather"] and out.content == "Let me check." and not out.errors
    # A call written in the middle of prose is prose.
    out = parse("You could call\n[get_weather(city='Paris')]\nif you like.")
    assert not out.calls and not out.errors and "if you like" in out.content


def test_a_half_written_call_list_is_a_parse_error() -> None:
    for text in ['[get_weather(city="Par', "[get_weather(city='Paris'), get_time(", "[f(x=1)]\n[g(y=2)]"]:
        out = parse(text)
        assert not out.calls and len(out.errors) == 1 and out.content == "", text
        assert "not valid Python" in out.errors[0].message and out.errors[0].raw == text.strip()


def test_one_bad_call_is_one_error_and_the_others_stand() -> None:
    out = parse("[f(x='é'), g(1), h(**k), i(*a), j(x=1, x=2), k(x={1, 2}), l(x=y.z), m(x=y[0]), "
                "n(x=[i for i in y]), o(x=f'{y}'), p(x=lambda: 1), q(x=b'1'), r(x=1j), s(y='ü')]")
    assert [(c.name, c.arguments) for c in out.calls] == [("f", {"x": "é"}), ("s", {"y": "ü"})]
    messages = [e.message for e in out.errors]
    assert len(messages) == 12 and messages[0].startswith("tool call 2: positional arguments")
    assert [e.raw for e in out.errors][:2] == ["g(1)", "h(**k)"]
    for fragment in ["**kwargs", "*args", "given twice", "Set", "Attribute", "Subscript", "ListComp",
                     "JoinedStr", "Lambda", "bytes", "complex"]:
        assert any(fragment in m for m in messages), fragment


def test_bounds_are_parse_errors_not_exceptions() -> None:
    deep = "[f(x=" + "[" * 60 + "]" * 60 + ")]"
    assert "nested more than 50" in parse(deep).errors[0].message
    assert "nested more than 50" in parse("[f(x=" + "1+" * 60 + "1)]").errors[0].message
    long = "[f(x='" + "a" * MAX_CHARS + "')]"
    assert "longer than" in parse(long).errors[0].message
    assert parse("[f(x=1)]" * 3000).errors  # a 3000-deep subscript chain: the parser's limit, an error


SECURITY_CASES = [
    "[__import__('os').system('touch {marker}')]",
    "[f(x=__import__('os').system('touch {marker}'))]",
    "[f(x=__import__('os').getpid())]",
    "[f(x=().__class__.__bases__[0].__subclasses__())]",
    "[f(x=(lambda: 1)())]",
    "[f(x=2**10**10)]",
    "[f(x=open('/etc/passwd').read())]",
    "[f(x=__builtins__)]",
    "[f(x=g(y=__import__('os').getcwd()))]",
]


def test_outputs_that_try_to_run_code_run_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each is a parse error; nothing runs (no marker file, no eval or exec, quick). An eval-based
    reader fails here: it creates the marker, returns a pid, or never finishes 2**10**10."""
    marker = tmp_path / "pwned"
    evaluated: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        evaluated.append(repr(args)[:80])
        raise AssertionError("the parser evaluated model output")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    for case in SECURITY_CASES:
        text = case.format(marker=marker)
        start = time.monotonic()
        out = parse_on_thread(PythonicParser(), text).result(timeout=5)
        assert time.monotonic() - start < 1, text
        assert not out.calls and len(out.errors) == 1, (text, out)
        assert not marker.exists() and not evaluated, text
    # A call with no keywords as a value is its source text, a harmless string.
    assert calls("[f(x=open('/etc/passwd'))]") == [("f", {"x": "open('/etc/passwd')"})]


def test_list_plugins_lists_it_without_importing_it() -> None:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "toolrl", "list-plugins"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert any(line.split()[:1] == ["pythonic"] and "tool_parsers: pythonic" in line
               for line in out.stdout.splitlines()), out.stdout
    assert "toolrl.parsers.pythonic" not in out.stderr  # importtime lists every module imported


def test_positional_arguments_bind_to_the_tools_parameters_in_order_when_asked() -> None:
    schemas = [{"type": "function", "function": {"name": "sort", "parameters": {
        "type": "object", "properties": {"file_name": {"type": "string"}, "reverse": {"type": "boolean"}}}}}]
    strict = PythonicParser()
    strict.bind_tools(schemas)
    assert strict.parse("[sort('a.txt')]").errors  # off by default: a parse error
    parser = PythonicParser(positional=True)
    parser.bind_tools(schemas)
    out = parser.parse("[sort('a.txt', reverse=True)]")
    assert [(c.name, c.arguments) for c in out.calls] == [("sort", {"file_name": "a.txt", "reverse": True})]
    for bad, why in [("[sort('a.txt', True, 3)]", "takes 2 arguments"), ("[grep('x')]", "no tool 'grep'"),
                     ("[sort('a.txt', file_name='b.txt')]", "given twice"), ("[sort(*xs)]", "*args")]:
        result = parser.parse(bad)
        assert not result.calls and why in result.errors[0].message, (bad, result)
