"""Built-in reward functions: gsm8k ``#### answer``, boxed math via math-verify, and a format reward."""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def _to_number(text: str) -> float | None:
    cleaned = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if there is
    none or it is unclosed."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start == -1:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    while i < len(text) and text[i] == " ":
        i += 1
    if i == len(text) or text[i] != "{":
        return None
    depth, begin = 0, i + 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:j]
    return None


class GSM8KReward:
    """1.0 when the answer after the last ``####`` (strict) — or the last number in the response
    (``method: flexible``) — equals the ground truth numerically; ``format_score`` when an answer
    was given but is wrong; 0 when none was found."""

    name = "gsm8k"

    def __init__(self, method: str = "strict", format_score: float = 0.0, score: float = 1.0) -> None:
        if method not in ("strict", "flexible"):
            raise ValueError("gsm8k reward: method must be 'strict' or 'flexible'")
        self.method, self.format_score, self.score = method, format_score, score

    def extract(self, response: str) -> str | None:
        if self.method == "strict":
            found = re.findall(r"####\s*(-?[\$\d,]*\.?\d+)", response)
            return found[-1] if found else None
        numbers = _NUMBER.findall(response)
        return numbers[-1] if numbers else None

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        answer = self.extract(response)
        if answer is None:
            return 0.0
        truth = _to_number(str(ground_truth).split("####")[-1])
        value = _to_number(answer)
        if truth is not None and value is not None and abs(truth - value) < 1e-6 * max(1.0, abs(truth)):
            return self.score
        return self.format_score


class MathReward:
    """1.0 when the last ``\\boxed{}`` (or the whole response with ``use_boxed: false``) is
    mathematically equivalent to the ground truth according to math-verify."""

    name = "math"

    def __init__(self, use_boxed: bool = True, format_score: float = 0.0) -> None:
        self.use_boxed, self.format_score = use_boxed, format_score

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        from math_verify import parse, verify

        answer = last_boxed(response) if self.use_boxed else response
        if answer is None:
            return 0.0
        gold = parse(f"${ground_truth}$") or parse(str(ground_truth))
        pred = parse(f"${answer}$") or parse(answer)
        try:
            return 1.0 if gold and pred and verify(gold, pred) else self.format_score
        except Exception:  # math-verify raises on exotic input; that answer is simply not correct
            return self.format_score


class FormatReward:
    """Rewards well-formed behaviour: ``score`` when the trajectory made no malformed tool call and
    the final response matches ``pattern`` (a regex, searched); ``min_tool_calls`` requires the model
    to have actually used tools."""

    name = "format"

    def __init__(self, pattern: str | None = None, score: float = 1.0, min_tool_calls: int = 0) -> None:
        self.pattern = re.compile(pattern, re.DOTALL) if pattern else None
        self.score, self.min_tool_calls = score, min_tool_calls

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        if info.get("parse_errors", 0):
            return 0.0
        if len(info.get("tool_results", ())) < self.min_tool_calls:
            return 0.0
        if self.pattern is not None and not self.pattern.search(response):
            return 0.0
        return self.score
