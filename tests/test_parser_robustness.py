"""Issue 24 (parser): every case through the command line, ``python -m toolrl parse``, in a fresh process.

Malformed calls stay feedback for the model: one parse error per bad call, the valid calls still
returned, the prose kept, and the output always strict JSON.
"""

import json

from _dists import make_dist, run_toolrl

BROKEN = '<tool_call>{"name": "f", "arguments": {"x": "oops}}</tool_call>'  # a string that never closes
VALID = '<tool_call>{"name": "g", "arguments": {"y": 1}}</tool_call>'
FENCES = json.dumps({"tags": {"calculator": {"tool": "calculator", "argument": "expression"}},
                     "fences": {"python": {"tool": "code_interpreter", "argument": "code"}}})


def reject_constant(name):
    raise ValueError(f"{name} in the output: not JSON")


def parse(stdin, *args, path=None):
    """The command's output, decoded as strict JSON (NaN/Infinity rejected)."""
    out = run_toolrl("parse", *args, "-", stdin=stdin, path=path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout, parse_constant=reject_constant)


def one_error_line(out, exit_code, *fragments):
    assert out.returncode == exit_code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_a_broken_call_does_not_swallow_the_next_valid_call():
    out = parse((BROKEN + VALID) * 2)
    assert out["calls"] == [{"name": "g", "arguments": {"y": 1}}] * 2
    assert [e["raw"] for e in out["errors"]] == [BROKEN] * 2  # each error holds its own call only
    assert all("invalid JSON" in e["message"] for e in out["errors"])
    assert out["content"] == ""


def test_25000_broken_valid_pairs_keep_every_valid_call():
    out = parse((BROKEN + VALID) * 25_000)
    assert len(out["calls"]) == 25_000 and len(out["errors"]) == 25_000


def test_prose_with_an_odd_quote_after_a_broken_call_is_kept():
    prose = 'The answer is 4, as he said "so.'
    out = parse(VALID + BROKEN + " " + prose)
    assert out["content"] == prose
    assert out["calls"] == [{"name": "g", "arguments": {"y": 1}}]
    assert [e["raw"] for e in out["errors"]] == [BROKEN]


def test_non_finite_numbers_are_parse_errors_and_the_output_stays_json():
    calls = ['{"name": "f", "arguments": {"x": 1e999}}',
             '{"name": "f", "arguments": {"x": [1, -2e400]}}',
             '{"name": "f", "arguments": "{\\"x\\": 1E+999}"}',  # string-encoded arguments
             '{"name": "f", "arguments": {"x": 1e308}, "extra": 1e999}']
    out = parse("".join(f"<tool_call>{c}</tool_call>" for c in calls) + VALID)
    assert out["calls"] == [{"name": "g", "arguments": {"y": 1}}]
    assert len(out["errors"]) == 4
    assert all("out of range (not a finite number)" in e["message"] for e in out["errors"]), out["errors"]


def test_a_parser_returning_infinity_is_reported_not_printed(tmp_path):
    make_dist(tmp_path, "toolrl-plugin-inf", "inf", "inf_parser_plugin", '''
        from toolrl import hookimpl
        from toolrl.parsers import ToolParser
        from toolrl.schemas import ParseResult, ToolCall

        class Inf(ToolParser):
            name = "inf"
            def parse(self, text):
                return ParseResult(calls=[ToolCall(name="f", arguments={"x": float(text)})])

        @hookimpl
        def register_tool_parsers(register):
            register(Inf)
    ''')
    assert parse("1.5", "--parser", "inf", path=tmp_path)["calls"] == [{"name": "f", "arguments": {"x": 1.5}}]
    out = run_toolrl("parse", "--parser", "inf", "-", stdin="inf", path=tmp_path)
    one_error_line(out, 1, "parser 'inf' returned a value that is not JSON")
    assert out.stdout == ""


def test_tags_parser_reads_a_crlf_fence():
    text = "Let me run it.\r\n```python\r\nx = 2\r\nprint(x * 3)\r\n```\r\nDone."
    out = parse(text, "--parser", "tags", "--options", FENCES)
    assert out["calls"] == [{"name": "code_interpreter", "arguments": {"code": "x = 2\nprint(x * 3)"}}]
    assert out["errors"] == [] and out["content"] == "Let me run it.\r\n\r\nDone."


def test_tags_parser_runs_calls_inside_think():
    """Intended (documented in tags.py and docs/rollouts.md): inline calls belong to the reasoning."""
    out = parse("<think>6*7 is <calculator>6*7</calculator> so</think> 42", "--parser", "tags", "--options", FENCES)
    assert out["calls"] == [{"name": "calculator", "arguments": {"expression": "6*7"}}]
    # hermes, by contrast, ignores calls in reasoning
    assert parse("<think>" + VALID + "</think>")["calls"] == []


def test_hundred_thousand_empty_calls():
    """Each is its own parse error (time: benchmarks/parser_throughput.py)."""
    out = parse("<tool_call></tool_call>" * 100_000 + "done")
    assert out["calls"] == [] and out["content"] == "done" and len(out["errors"]) == 100_000
    assert {e["message"] for e in out["errors"]} == {'empty tool call: expected {"name": ..., "arguments": {...}}'}
    assert {e["raw"] for e in out["errors"]} == {"<tool_call></tool_call>"}


def test_bad_parser_options_are_one_line_errors():
    one_error_line(run_toolrl("parse", "--options", "{nope", "-", stdin=""), 2, "invalid JSON in --options: ")
    one_error_line(run_toolrl("parse", "--options", '{"x": 1}', "-", stdin=""), 2,
                   "--options: parser 'hermes' takes no options")
    one_error_line(run_toolrl("parse", "--parser", "tags", "--options", '{"tags": {"c": {"tool": "t"}}}', "-",
                              stdin=""), 2, "--options: invalid options for parser 'tags'", "argument")
