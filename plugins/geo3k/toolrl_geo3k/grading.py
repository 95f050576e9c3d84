"""Answer grading with math-verify: parse both sides to SymPy and compare them.

math-verify bounds its own work with ``signal.alarm`` timeouts, which exist only in the main thread.
Elsewhere (Ray workers, thread pools) it runs without them, so every parsed expression first passes a
structural guard: towers such as ``10^{10^{10}}``, ``e^{e^{e^{10}}}`` or ``100!!`` would make SymPy
compute for minutes, and are graded as wrong without being compared.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

MAX_ANSWER_CHARS = 500
GRADING_TIMEOUT_S = 2  # per parse and per comparison; math-verify takes whole seconds
_MAX_NODES = 200
_MAX_EXPONENT = 100
_MAX_FACTORIAL = 1_000
_MAX_INTEGER_BITS = 10_000


def _timeout() -> int | None:
    return GRADING_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None



def _is_growth(node: Any) -> bool:
    """Nodes whose value can explode: powers above 1, exp, factorials."""
    from sympy import Pow, exp
    from sympy.functions.combinatorial.factorials import factorial

    if isinstance(node, Pow):
        return not (node.exp.is_Number and abs(node.exp) <= 1)
    return isinstance(node, (exp, factorial))


def _tractable(value: Any) -> bool:
    """False for expressions SymPy could spend unbounded time on (see the module docstring)."""
    from sympy import Basic, Integer, Pow, exp, preorder_traversal
    from sympy.functions.combinatorial.factorials import factorial

    if not isinstance(value, Basic):
        return True
    for count, node in enumerate(preorder_traversal(value)):
        if count > _MAX_NODES:
            return False
        if isinstance(node, Integer) and int(node).bit_length() > _MAX_INTEGER_BITS:
            return False
        if isinstance(node, (Pow, exp)):
            arg = node.exp if isinstance(node, Pow) else node.args[0]
        elif isinstance(node, factorial):
            arg = node.args[0]
            if not arg.free_symbols and not (arg.is_Integer and abs(arg) <= _MAX_FACTORIAL):
                return False
            continue
        else:
            continue
        if arg.free_symbols:
            continue
        if arg.is_Number:
            if abs(arg) > _MAX_EXPONENT:
                return False
        elif any(_is_growth(n) for n in preorder_traversal(arg)):
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[Any, ...]:
    from math_verify import parse

    timeout = _timeout()
    if any(marker in text for marker in ("\\boxed", "\\fbox", "$", "\\(", "\\[")):
        parsed = parse(text, parsing_timeout=timeout)
    else:  # a bare answer: read it as LaTeX math ("\frac{1}{2}", "2\sqrt{3}"), else as plain text ("1/2")
        parsed = parse(f"${text}$", parsing_timeout=timeout) or parse(text, parsing_timeout=timeout)
    return tuple(parsed)


def parse_answer(text: str) -> list[Any]:
    """math-verify's parse of an answer (SymPy objects and the matched strings); empty when the text
    has no parseable answer, is too long, or is a runaway expression."""
    text = text.strip()
    if not text or len(text) > MAX_ANSWER_CHARS:
        return []
    parsed = list(_parse(text))
    return parsed if all(_tractable(v) for v in parsed) else []


def is_equivalent(answer: str, ground_truth: str) -> bool:
    """Whether ``answer`` is mathematically equal to ``ground_truth`` (``\\frac{1}{2}`` = ``0.5`` =
    ``\\boxed{1/2}``)."""
    from math_verify import verify

    gold, target = parse_answer(str(ground_truth)), parse_answer(answer)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=_timeout()))
