"""The shaped reward (``reward: shaped``): a finer-grained training signal than BFCL's pass/fail, in the
manner of ToolRL's decomposed reward (a format part, then correctness by name, parameter and value) —
whether the answer is a call list BFCL's decoder reads (1; an attempt that does not decode, 0.5), how many
expected functions were called, how many of their parameters were named, how many values were among BFCL's
possible answers. Each part is in [0, 1] and the reward is their mean. It is not BFCL's score: evaluation
always counts the verdict.

Matching is by function name, expected calls in order, each predicted call used once; a parameter whose
possible answers include ``""`` is optional (BFCL's convention) and counts only when given.
"""

from __future__ import annotations

from typing import Any


def _name(name: str, format: str) -> str:
    return name.replace(".", "_") if format == "native" else name


def _value_matches(value: Any, possible: list[Any]) -> bool:
    if value in possible:
        return True
    # BFCL's checker accepts an int where a float is expected and compares strings loosely; so do we,
    # roughly: a signal, not a verdict.
    if isinstance(value, str):
        folded = value.strip().lower()
        return any(isinstance(p, str) and p.strip().lower() == folded for p in possible)
    return any(isinstance(p, int | float) and isinstance(value, int | float) and float(p) == float(value)
               for p in possible)


def match_parts(calls: list[dict[str, dict[str, Any]]], ground_truth: list[dict[str, dict[str, list[Any]]]],
                format: str) -> dict[str, float]:
    """``name``, ``params`` and ``values``: the three parts, each in [0, 1]."""
    predicted = [(name, args) for call in calls for name, args in call.items()]
    expected = [(_name(name, format), params) for call in ground_truth for name, params in call.items()]
    if not expected:
        return {}
    used: set[int] = set()
    names = params = values = 0.0
    for name, possible in expected:
        match = next((i for i, (n, _) in enumerate(predicted) if n == name and i not in used), None)
        if match is None:
            continue
        used.add(match)
        names += 1
        args = predicted[match][1]
        required = {p for p, options in possible.items() if "" not in options}
        wanted = required | (set(args) & set(possible))
        stray = set(args) - set(possible)
        params += len(wanted & set(args)) / max(len(wanted | stray), 1)
        given = [p for p in wanted if p in args]
        values += sum(_value_matches(args[p], possible[p]) for p in given) / max(len(wanted), 1)
    count = max(len(expected), len(predicted))
    return {"name": names / count, "params": params / len(expected), "values": values / len(expected)}


def shaped_reward(parts: dict[str, float]) -> float:
    return (parts["format"] + parts["name"] + parts["params"] + parts["values"]) / 4
