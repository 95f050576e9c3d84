"""Writes tests/recorded/*.jsonl: the model answers the parity test (test_parity.py) scores with toolrl and
with `bfcl evaluate`. Deterministic (seeded): `python plugins/bfcl/tests/make_recorded.py` writes the same
files again from bfcl-eval 2026.3.23's data.

Each line of a single-turn category's file is ``{"id", "kind", "text"}``: one entry and the raw text a model
answered it with, in BFCL's prompting format (``[func(param=value), ...]``). The kinds are the answers models
give: right answers (from BFCL's possible answers; bare, without brackets, in a fence), wrong values, a wrong
function, a missing parameter, an extra call, a call list cut short, positional arguments, prose, prose
before a call list, an empty ``[]``; irrelevance entries get prose, ``[]`` and calls, relevance entries calls
and prose. multi_turn_base.jsonl holds ``{"id", "kind", "turns"}``: per user turn, the raw text of each
step (model turn), as BFCL's result files hold them: the steps with calls, then the answer that ends the turn
(right answers from the ground truth, calls split over steps, a wrong value, a turn skipped, a call to a
function that does not exist, a fenced step, a step cut short before the calls). Nothing here evaluates code, and no text asks the evaluator to: BFCL's own decoder ``eval``s
arithmetic in arguments, so the texts hold none.
"""

from __future__ import annotations

import ast
import inspect
import json
import random
from pathlib import Path
from typing import Any

from toolrl_bfcl import categories

OUT = Path(__file__).resolve().parent / "recorded"
SEED = 20260323

AST_KINDS = ["right", "right_bare", "right_fenced_python", "right_fenced_plain", "wrong_value", "wrong_function",
             "missing_param", "extra_call", "cut_short", "positional", "prose", "prose_then_call", "empty"]
IRRELEVANCE_KINDS = ["prose", "prose_refusal", "empty", "call", "call_fenced_python", "cut_short", "positional",
                     "prose_then_call"]
RELEVANCE_KINDS = ["call", "call_other_function", "call_fenced_python", "prose", "empty", "cut_short"]
PROSE = ["I'm sorry, but I can't help with that request.",
         "To answer this I would need more details: which unit do you want the result in?",
         "Let me think about this step by step. The answer is probably 42.",
         "None of the functions I have can do this, so I will answer directly: it depends on the context."]


def pick(options: list[Any]) -> tuple[bool, Any]:
    """A possible answer's first value that is not "" (BFCL's mark of an optional parameter): (False, None)
    when the parameter may be left out and has no other value."""
    for option in options:
        if option != "":
            return True, resolve(option)
    return False, None


def resolve(value: Any) -> Any:
    """A value as written: a dict of possible answers (each key's list of values) becomes one dict."""
    if isinstance(value, dict):
        out = {}
        for key, options in value.items():
            present, chosen = pick(options) if isinstance(options, list) else (True, options)
            if present:
                out[key] = chosen
        return out
    if isinstance(value, list):
        return [resolve(v) for v in value]
    return value


def right_calls(ground_truth: list[dict[str, dict[str, list[Any]]]]) -> list[tuple[str, dict[str, Any]]]:
    calls = []
    for call in ground_truth:
        for name, params in call.items():
            args = {}
            for param, options in params.items():
                present, chosen = pick(options)
                if present:
                    args[param] = chosen
            calls.append((name, args))
    return calls


def render(calls: list[tuple[str, dict[str, Any]]], brackets: bool = True) -> str:
    body = ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args in calls)
    return f"[{body}]" if brackets else body


def dummy(schema: dict[str, Any]) -> Any:
    """A value of a parameter's type (irrelevance and relevance entries have no possible answers)."""
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "example", "integer": 3, "float": 2.5, "number": 2.5, "boolean": True, "array": ["example"],
            "dict": {}, "tuple": ["example"], "any": "example"}.get(schema.get("type"), "example")


def dummy_call(function: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    properties = function["parameters"].get("properties", {})
    return function["name"], {p: dummy(properties[p]) for p in function["parameters"].get("required", [])
                              if p in properties}


def wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7919
    if isinstance(value, float):
        return value + 1000.5
    if isinstance(value, list):
        return [*value, "unexpected"] if value else ["unexpected"]
    if isinstance(value, dict):
        return {**value, "unexpected": "value"}
    return f"{value} (not this one)" if value else "not this one"


def ast_text(kind: str, entry: dict[str, Any], rng: random.Random) -> str:
    calls = right_calls(entry["ground_truth"])
    name, args = calls[0]
    if kind == "right":
        return render(calls)
    if kind == "right_bare":
        return render(calls, brackets=False)
    if kind == "right_fenced_python":
        return f"```python\n{render(calls)}\n```"
    if kind == "right_fenced_plain":
        return f"```\n{render(calls)}\n```"
    if kind == "wrong_value":
        if not args:
            return render([(name, {"unexpected": 1}), *calls[1:]])
        param = rng.choice(sorted(args))
        return render([(name, {**args, param: wrong(args[param])}), *calls[1:]])
    if kind == "wrong_function":
        others = [f["name"] for f in entry["function"] if f["name"] != name]
        return render([(others[0] if others else name + "_v2", args), *calls[1:]])
    if kind == "missing_param":
        function = next(f for f in entry["function"] if f["name"] == name)
        required = [p for p in function["parameters"].get("required", []) if p in args] or sorted(args)
        if not required:
            return render([(name, {}), *calls[1:]])
        dropped = rng.choice(required)
        return render([(name, {k: v for k, v in args.items() if k != dropped}), *calls[1:]])
    if kind == "extra_call":
        return render([*calls, calls[0]])
    if kind == "cut_short":
        text = render(calls)
        return text[: max(len(text) * 2 // 3, len(name) + 2)]
    if kind == "positional":
        values = ", ".join(repr(v) for v in args.values())
        return f"[{name}({values})]"
    if kind == "prose":
        return rng.choice(PROSE)
    if kind == "prose_then_call":
        return f"Sure, here is the call that answers it:\n{render(calls)}"
    if kind == "empty":
        return "[]"
    raise ValueError(kind)


def no_answer_text(kind: str, entry: dict[str, Any], rng: random.Random) -> str:
    """An irrelevance or relevance entry's answer (there are no possible answers to draw from)."""
    functions = entry["function"]
    call = dummy_call(functions[0])
    if kind == "prose":
        return rng.choice(PROSE)
    if kind == "prose_refusal":
        return "I cannot answer this with the functions provided; none of them applies to the question."
    if kind == "empty":
        return "[]"
    if kind == "call":
        return render([call])
    if kind == "call_other_function":
        return render([dummy_call(functions[-1])])
    if kind == "call_fenced_python":
        return f"```python\n{render([call])}\n```"
    if kind == "cut_short":
        text = render([call])
        return text[: max(len(text) * 2 // 3, len(call[0]) + 2)]
    if kind == "positional":
        return f"[{call[0]}({', '.join(repr(v) for v in call[1].values()) or repr('example')})]"
    if kind == "prose_then_call":
        return f"Let me look that up.\n{render([call])}"
    raise ValueError(kind)


MULTI_TURN_KINDS = ["right", "right_split_steps", "wrong_value", "skipped_turn", "unknown_function",
                    "fenced_step", "cut_short_step_then_calls"]
DONE = "Done."


def keyword_call(source: str, methods: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string (``cd('x')`` or ``cd(folder='x')``) with every argument named, from the
    backend method's signature."""
    tree = ast.parse(source, mode="eval").body
    assert isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name), source
    names = list(inspect.signature(methods[tree.func.id]).parameters)
    return tree.func.id, {**{names[i]: ast.literal_eval(a) for i, a in enumerate(tree.args)},
                          **{k.arg: ast.literal_eval(k.value) for k in tree.keywords}}


def multi_turn_turns(kind: str, entry: dict[str, Any]) -> list[list[str]]:
    from toolrl_bfcl.multi_turn import build_backends, public_methods

    methods = public_methods(build_backends(entry))
    truth = [[keyword_call(c, methods) for c in calls] for calls in entry["ground_truth"]]
    first = next(i for i, calls in enumerate(truth) if calls)  # the first turn with calls
    turns: list[list[str]] = []
    for index, calls in enumerate(truth):
        if not calls:
            turns.append(["I cannot do that with the functions I have."])
            continue
        steps = [render(calls)]
        if index == first:
            if kind == "right_split_steps":
                steps = [render([c]) for c in calls]
            elif kind == "wrong_value":
                name, args = calls[0]
                param = next((p for p, v in args.items() if isinstance(v, str)), None)
                steps = [render([(name, {**args, param: wrong(args[param])} if param else {**args, "x": 1}),
                                 *calls[1:]])]
            elif kind == "skipped_turn":
                steps = []
            elif kind == "unknown_function":
                steps = [render([("undo_last_action", {"steps": 1})]), *steps]
            elif kind == "fenced_step":
                steps = [f"```python\n{steps[0]}\n```"]
            elif kind == "cut_short_step_then_calls":
                # Past the call's "(": toolrl's parser reads it as a malformed call (the model keeps the
                # turn); BFCL's decoder fails on it and skips the step.
                steps = [steps[0][: max(len(steps[0]) // 2, steps[0].index("(") + 3)], *steps]
        turns.append([*steps, DONE if steps else "I will leave that for now."])
    return turns


def multi_turn_recorded(rng: random.Random) -> list[dict[str, Any]]:
    """A few multi_turn_base entries of at most four turns (the checker re-runs every call: kept small)."""
    entries = [e for e in categories.entries("multi_turn_base") if len(e["ground_truth"]) <= 4
               and sum(map(len, e["ground_truth"])) <= 6]
    chosen = sorted(rng.sample(range(len(entries)), len(MULTI_TURN_KINDS)))
    order = list(MULTI_TURN_KINDS)
    rng.shuffle(order)
    return [{"id": entries[i]["id"], "kind": kind, "turns": multi_turn_turns(kind, entries[i])}
            for i, kind in zip(chosen, order, strict=True)]


def recorded(category: str, rng: random.Random) -> list[dict[str, str]]:
    kind_of = categories.KINDS[category]
    kinds = {"ast": AST_KINDS, "irrelevance": IRRELEVANCE_KINDS, "relevance": RELEVANCE_KINDS}[kind_of]
    entries = categories.entries(category)
    chosen = sorted(rng.sample(range(len(entries)), len(kinds)))
    order = list(kinds)
    rng.shuffle(order)
    rows = []
    for index, kind in zip(chosen, order, strict=True):
        entry = entries[index]
        text = ast_text(kind, entry, rng) if kind_of == "ast" else no_answer_text(kind, entry, rng)
        rows.append({"id": entry["id"], "kind": kind, "text": text})
    return rows


def main() -> None:
    OUT.mkdir(exist_ok=True)
    rng = random.Random(SEED)
    for category in categories.GROUPS["single_turn"]:
        rows = recorded(category, rng)
        (OUT / f"{category}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"{category}: {len(rows)} answers")
    rows = multi_turn_recorded(rng)
    (OUT / "multi_turn_base.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"multi_turn_base: {len(rows)} answers")


if __name__ == "__main__":
    main()
