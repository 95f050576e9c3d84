"""Tool-call parser throughput: one response with N calls, side by side with ``json.loads`` of the
same call bodies (the floor for any parser that decodes JSON) and, optionally, the parser at an
older git revision (the quadratic one before issue 13).

    OMP_NUM_THREADS=1 python benchmarks/parser_throughput.py [--runs 5] [--old-ref d424eb5] [--families-only]

Prints the median seconds per response, calls per second and the ratios, then the time of hostile
inputs (deep nesting, huge numbers, tags inside strings, thousands of broken calls) at their size and
at twice it (the ratio is ~2 when parsing is linear), then ``toolrl parse`` end to end on 10^5 empty
calls (wall and the child's CPU seconds, which machine load inflates less). ``--old-ref`` adds the
hermes parser at that revision to every table and ``toolrl parse`` with that revision's core/, run
by turns with today's so load hits both alike. Goals: 10,000 calls in under a second; the 10^5 empty
calls through the command line in under a second. The model-family parsers (``families``) follow: the
same sizes in each family's syntax, and hostile inputs written in its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, single_thread, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def call_body(i: int) -> str:
    return json.dumps({"name": "python", "arguments": {"code": f"print({i} * 2)  # step {i}", "timeout": 5}})


def response(n: int) -> str:
    return "Let me work through these.\n" + "\n".join(f"<tool_call>{call_body(i)}</tool_call>" for i in range(n))


def old_parser(ref: str) -> Callable[[str], object]:
    """The hermes parser as it was at ``ref``, loaded from git into a throwaway module."""
    source = subprocess.run(["git", "show", f"{ref}:core/toolrl/parsers/hermes.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"hermes_{ref}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"hermes@{ref}", "exec"), module.__dict__)
    return module.HermesParser().parse


def timed(fn: Callable[[Any], object], arg: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t)
    return median(times)


def main() -> None:
    single_thread()
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 10000])
    ap.add_argument("--old-ref", help="also time the hermes parser at this git revision")
    ap.add_argument("--old-max", type=int, default=10000, help="skip the old parser above this many calls")
    ap.add_argument("--families-only", action="store_true", help="time only the model-family parsers")
    args = ap.parse_args()
    if args.families_only:
        print(machine())
        families(args.runs, args.sizes)
        return

    from toolrl.parsers.hermes import HermesParser
    from toolrl.parsers.tags import TagParser

    # The tags parser has no routes of its own: the calculator route its environments configure.
    hermes = HermesParser().parse
    tags = TagParser(tags={"calculator": {"tool": "calculator", "argument": "expression"}}).parse
    old = old_parser(args.old_ref) if args.old_ref else None
    print(machine())
    rows = []
    for n in args.sizes:
        text = response(n)
        bodies = [call_body(i) for i in range(n)]
        inline = "".join(f"step {i}: <calculator>{i} * 2</calculator>\n" for i in range(n))
        assert len(hermes(text).calls) == n and len(tags(inline).calls) == n  # type: ignore[attr-defined]
        t_new = timed(hermes, text, args.runs)
        t_json = timed(lambda bs: [json.loads(b) for b in bs], bodies, args.runs)
        t_tags = timed(tags, inline, args.runs)
        t_old = timed(old, text, 1) if old and n <= args.old_max else float("nan")
        rows.append([n, len(text) // 1024, t_new, n / t_new, t_json, t_new / t_json, t_old, t_old / t_new, t_tags])
    print(table(["calls", "KiB", "hermes s", "calls/s", "json.loads s", "hermes/json", "old s", "old/new",
                 "tags s"], rows))
    for r in rows:
        if r[0] == 10_000:
            print(f"goal: 10,000 calls in under 1 s -> {r[2]:.3f} s ({'met' if r[2] < 1 else 'NOT met'})")

    hostile(hermes, old, args.runs)
    cli(args.old_ref, args.runs)
    families(args.runs, args.sizes)


def hostile(hermes: Callable[[str], Any], old: Callable[[str], Any] | None, runs: int) -> None:
    """Each hostile input at its size and twice it, with the old parser's result and time beside."""
    rows = []
    for name, make in HOSTILE.items():
        text, double = make(1), make(2)
        out = hermes(text)
        t1, t2 = timed(hermes, text, runs), timed(hermes, double, runs)
        row = [name, len(text) // 1024, t1, len(out.calls), len(out.errors), t2 / t1]
        if old is not None:
            before = old(text)
            row += [timed(old, text, runs), len(before.calls), len(before.errors)]
        rows.append(row)
    print(table(["hostile input", "KiB", "hermes s", "calls", "errors", "2x input / 1x"]
                + (["old s", "old calls", "old errors"] if old is not None else []), rows))


def cli(old_ref: str | None, runs: int) -> None:
    """``toolrl parse`` on 10^5 empty calls, and at ``old_ref`` (its core/ from git) run by turns."""
    text = HOSTILE["10^5 empty calls"](1)
    cores = {"now": ""}
    with tempfile.TemporaryDirectory() as tmp:
        if old_ref:
            archive = subprocess.run(["git", "archive", old_ref, "core"], cwd=ROOT, check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            cores[old_ref] = str(Path(tmp) / "core")
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in cores}
        for _ in range(runs):
            for name, core in cores.items():
                times[name].append(cli_parse(text, core))
    for name, ts in times.items():
        wall, cpu = median([t[0] for t in ts]), median([t[1] for t in ts])
        print(f"toolrl parse at {name}, 10^5 empty calls ({len(text) // 1024} KiB): wall {wall:.3f} s, "
              f"child CPU {cpu:.3f} s (goal < 1 s: {'met' if wall < 1 else 'NOT met'} on wall, "
              f"{'met' if cpu < 1 else 'NOT met'} on CPU)")

BROKEN = '<tool_call>{"name": "f", "arguments": {"x": "oops}}</tool_call>'  # a string that never closes
VALID = '<tool_call>{"name": "g", "arguments": {"y": 1}}</tool_call>'
HOSTILE: dict[str, Callable[[int], str]] = {  # input at scale k (1 or 2)
    "[ x 100k in a call": lambda k: "<tool_call>" + "[" * 100_000 * k + "</tool_call>",
    "number of 1M digits": lambda k: '<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 1_000_000 * k + "}}</tool_call>",
    "10k calls, tags in strings": lambda k: "".join(
        "<tool_call>" + json.dumps({"name": "f", "arguments": {"s": "</tool_call><tool_call></think>"}})
        + "</tool_call>" for _ in range(10_000 * k)),
    "50k unterminated calls": lambda k: '<tool_call>{"name": "f"' * 50_000 * k,
    "20k calls, string to the end": lambda k: '<tool_call>\\"' * 20_000 * k,
    "50k stray closes in think": lambda k: "<think>" + "</tool_call>" * 50_000 * k,
    "10^5 empty calls": lambda k: "<tool_call></tool_call>" * 100_000 * k,
    "[broken, valid] x 25k": lambda k: (BROKEN + VALID) * 25_000 * k,
    "[broken, valid] x 25k, odd quote after": lambda k: (BROKEN + VALID) * 25_000 * k + ' he said "so',
}


def cli_parse(text: str, core: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -m toolrl parse -`` reading ``text`` on stdin, with ``core``
    (a checkout's core/ directory) first on the path when given."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if core:
        env["PYTHONPATH"] = os.pathsep.join([core, env.get("PYTHONPATH", "")])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "toolrl", "parse", "-"], input=text.encode(), check=True,
                   capture_output=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def family_response(family: str, n: int) -> str:
    """One response with ``n`` calls in ``family``'s syntax (the corpus's renderers)."""
    from toolrl.testing import parser_corpus as corpus

    calls = [("python", {"code": f"print({i} * 2)  # step {i}", "timeout": 5}) for i in range(n)]
    if family == "deepseek_v3":
        return "Let me work through these.\n" + corpus.deepseek_v3(*calls)
    if family == "mistral":
        return "Let me work through these.\n" + "".join(corpus.mistral(*c) for c in calls)
    if family == "llama3_json":
        return "<|python_tag|>" + "; ".join(corpus.llama3_json(*c) for c in calls)
    render = getattr(corpus, family)
    return "Let me work through these.\n" + "\n".join(render(*c) for c in calls)


def family_hostile(family: str) -> dict[str, str]:
    """Inputs that would make a careless parser quadratic or raise, in ``family``'s markers: the call's
    value is the ``search`` tool's ``filters`` object, so the XML formats decode it too."""
    opener, value, closer = {
        "qwen3_coder": ("<tool_call>", "<function=search>\n<parameter=filters>\n",
                        "\n</parameter>\n</function>\n</tool_call>"),
        "glm45": ("<tool_call>", "search<arg_key>filters</arg_key><arg_value>", "</arg_value></tool_call>"),
        "gemma": ("<|tool_call>", "call:search{filters:", "}<tool_call|>"),
        "deepseek_v3": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n",
                        "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        "mistral": ("[TOOL_CALLS]", "search[ARGS]", ""),
        "llama3_json": ("<|python_tag|>", "", ""),
        "gpt_oss": ("<|channel|>commentary to=functions.search<|message|>", "", "<|call|>"),
    }[family]
    return {
        "50k unterminated calls": (opener + value + '{"x": ') * 50_000,
        "[ x 100k in a call": opener + value + "[" * 100_000 + closer,
        "{ x 100k in a call": opener + value + '{"a":' * 100_000 + closer,
        "number of 1M digits": opener + value + '{"x": ' + "9" * 1_000_000 + "}" + closer,
        "string to the end x 20k": (opener + value + '{"x": "\\') * 20_000,
    }


def families(runs: int, sizes: list[int]) -> None:
    """Every model-family parser: N calls per response, and hostile inputs (all must stay linear)."""
    from toolrl.plugins import get_plugins
    from toolrl.testing.parser_corpus import FAMILIES, TOOLS

    rows, hostile_rows = [], []
    for family in FAMILIES:
        parser = get_plugins().load_part("tool_parsers", family)()
        parser.bind_tools(TOOLS)
        for n in sizes:
            text = family_response(family, n)
            out = parser.parse(text)
            assert len(out.calls) == n and not out.errors, (family, n, out.errors[:1])
            t = timed(parser.parse, text, runs)
            rows.append([family, n, len(text) // 1024, t, n / t, "met" if n < 10_000 or t < 1 else "NOT met"])
        for name, text in family_hostile(family).items():
            out = parser.parse(text)
            hostile_rows.append([family, name, len(text) // 1024, timed(parser.parse, text, runs),
                                 len(out.calls), len(out.errors)])
    print(table(["family", "calls", "KiB", "parse s", "calls/s", "10k < 1 s"], rows))
    print(table(["family", "hostile input", "KiB", "parse s", "calls", "errors"], hostile_rows))


if __name__ == "__main__":
    main()
