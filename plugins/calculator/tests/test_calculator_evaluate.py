"""The safe evaluator: values, formatting, every refusal, and properties over generated input."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolrl_calculator.evaluate import MAX_INT_BITS, CalculatorError, evaluate, format_number


def calc(expression: str) -> str:
    return format_number(evaluate(expression))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("7/2", "3.5"),
        ("2/3", "0.6666666666666666"),
        ("10/2", "5"),
        ("7//2", "3"),
        ("-7//2", "-4"),
        ("7 % 3", "1"),
        ("-7 % 3", "2"),
        ("2**10", "1024"),
        ("2^10", "1024"),
        ("2^3^2", "512"),  # right-associative, as in mathematics
        ("-2^2", "-4"),
        ("2**-2", "0.25"),
        ("+-+3", "-3"),
        ("2**100", str(2**100)),
        ("123456789 * 987654321", str(123456789 * 987654321)),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("1e3", "1000"),
        ("1e20", "1e+20"),
        ("sqrt(16)", "4"),
        ("sqrt(2)", repr(math.sqrt(2))),
        ("abs(-3)", "3"),
        ("round(2.567, 2)", "2.57"),
        ("round(2.5)", "2"),
        ("min(3, 1, 2)", "1"),
        ("max(3, 1, 2)", "3"),
        ("floor(2.7)", "2"),
        ("ceil(2.1)", "3"),
        ("log(8, 2)", "3"),
        ("log(e)", "1"),
        ("log10(1000)", "3"),
        ("exp(0)", "1"),
        ("sin(0) + cos(0)", "1"),
        ("tan(pi/4)", repr(math.tan(math.pi / 4))),
        ("pi", repr(math.pi)),
        ("factorial(20)", str(math.factorial(20))),
        ("  1 + 2 \n", "3"),
        ("3 × 4 ÷ 2", "6"),
        ("5 − 2", "3"),
        ("-0.0", "0"),
        ("2**8191", str(2**8191)),
    ],
)
def test_values(expression: str, expected: str) -> None:
    assert calc(expression) == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("1+", "invalid syntax"),
        ("(1", "invalid syntax"),
        ("1/0", "division by zero"),
        ("1//0", "division by zero"),
        ("1%0", "division by zero"),
        ("0**-1", "division by zero"),
        ("log(8, 1)", "division by zero"),
        ("sqrt(-1)", "domain"),
        ("log(0)", "domain"),
        ("asin(2)", "domain"),
        ("(-8)**(1/3)", "fractional power"),
        ("9**9**9**9", "too large"),
        ("10**10**10", "too large"),
        ("2**8192", "too large"),
        ("(2**4096)*(2**4096)", "too large"),
        ("factorial(5000)", "too large"),
        ("factorial(-1)", "non-negative integer"),
        ("factorial(2.5)", "non-negative integer"),
        ("1e999", "too large"),
        ("exp(1000)", "too large"),
        ("1e308 * 10", "too large"),
        ("2.0 ** 10000", "too large"),
        ("10**3000 + 0.5", "too large"),
        ("x", "unknown name 'x'"),
        ("sqrt", "did you mean sqrt(...)"),
        ("__import__('os').system('true')", "only these functions"),
        ("open('/etc/passwd')", "only these functions"),
        ("(1).real", "attribute access"),
        ("[1, 2][0]", "subscripts"),
        ("[1, 2]", "lists"),
        ("(1, 2)[0]", "subscripts"),
        ("1, 2", "tuples"),
        ("1 < 2", "comparisons"),
        ("1 and 2", "boolean operators"),
        ("not 1", "the operator not"),
        ("~1", "the operator ~"),
        ("1 if 1 else 2", "conditional"),
        ("lambda: 1", "lambda"),
        ("[i for i in (1, 2)]", "comprehensions"),
        ("'a'", "not a number"),
        ("True", "not a number"),
        ("None", "not a number"),
        ("1j", "not a number"),
        ("1 | 2", "BitOr"),
        ("1 << 2", "LShift"),
        ("(x := 1)", "assignment"),
        ("sqrt(x=1)", "positional arguments only"),
        ("sqrt(*[4])", "positional arguments only"),
        ("sqrt(1, 2)", "takes 1 argument"),
        ("max()", "takes 1 to 32 argument"),
        ("round(1.5, 1.5)", "integer number of digits"),
        ("1" * 1001, "too long"),
        ("-" * 300 + "1", "nested too deeply"),
        ("(" * 300 + "1" + ")" * 300, "nested"),
        ("1\x00", "null bytes"),
    ],
)
def test_refusals(expression: str, reason: str) -> None:
    with pytest.raises(CalculatorError) as info:
        evaluate(expression)
    assert reason in str(info.value), str(info.value)


def test_tower_of_powers_fails_at_once() -> None:
    start = time.process_time()
    with pytest.raises(CalculatorError, match="too large"):
        evaluate("9**9**9**9")
    assert time.process_time() - start < 0.05


def test_non_string_is_refused() -> None:
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(12)  # type: ignore[arg-type]


# -- properties ---------------------------------------------------------------------------------

ALPHABET = "0123456789+-*/%^().,e pisqrtlogfacm×÷_[]'\"<>=!~&|"
numbers = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(repr),
    st.sampled_from(["pi", "e", "9", "99", "1e308"]),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "^"]), children).map(
            lambda t: f"({t[0]}{t[1]}{t[2]})"
        ),
        st.tuples(st.sampled_from(["-", "+"]), children).map("".join),
        st.tuples(st.sampled_from(["sqrt", "log", "exp", "factorial", "floor", "sin", "abs"]), children).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: f"max({', '.join(xs)})"),
    )


expressions = st.recursive(numbers, _combine, max_leaves=12)


def _bounded(expression: str) -> None:
    # CPU time, not wall time: the bound is on the work the evaluator does (an unbounded power or
    # factorial would take seconds), which a loaded machine does not change.
    start = time.process_time()
    try:
        result = evaluate(expression)
    except CalculatorError:
        pass
    else:
        assert isinstance(result, (int, float)) and not isinstance(result, bool)
        assert format_number(result)
    assert time.process_time() - start < 0.25, f"{expression!r} took {time.process_time() - start:.3f} s of CPU"


@settings(max_examples=600, deadline=None)
@given(expressions)
def test_generated_expressions_never_raise_and_stay_fast(expression: str) -> None:
    _bounded(expression)


@settings(max_examples=800, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=120) | st.text(max_size=200))
def test_arbitrary_text_never_raises_and_stays_fast(text: str) -> None:
    _bounded(text)


small = st.integers(min_value=-50, max_value=50).map(lambda n: f"({n})")
integer_expressions = st.recursive(
    small,
    lambda c: st.one_of(
        st.tuples(c, st.sampled_from(["+", "-", "*", "//", "%"]), c).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        st.tuples(c, st.integers(min_value=0, max_value=5)).map(lambda t: f"({t[0]}**{t[1]})"),
    ),
    max_leaves=10,
)


@settings(max_examples=500, deadline=None)
@given(integer_expressions)
def test_integer_arithmetic_matches_python(expression: str) -> None:
    try:
        expected = eval(expression, {"__builtins__": {}})  # generated from digits and operators only
    except ZeroDivisionError:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression)
        return
    try:
        assert evaluate(expression) == expected
    except CalculatorError as exc:  # only refusals of results beyond the size cap are allowed
        assert "too large" in str(exc) and abs(expected).bit_length() > MAX_INT_BITS // 2, (expression, exc)
