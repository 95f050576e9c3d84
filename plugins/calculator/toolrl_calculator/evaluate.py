"""Safe, bounded arithmetic.

The expression is parsed with :mod:`ast` and walked by a small interpreter that knows only numbers,
``+ - * / // % **``, unary ``+``/``-``, parentheses, a few constants and whitelisted functions: no
names, attributes, subscripts, comprehensions or other calls exist for it. Every size is bounded
*before* work is done (expression length, node count, nesting depth, the bit length of integer
results, exponents and factorials), so inputs such as ``9**9**9**9`` fail at once instead of
computing. Integers are exact; anything else is a float and must stay finite.
"""

from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

Number = int | float

MAX_EXPRESSION_CHARS = 1000
MAX_NODES = 1000
MAX_DEPTH = 200
# Integer results up to 8192 bits (~2466 digits): far below Python's 4300-digit str() limit and
# cheap to multiply, so the caps above also bound the time of a whole evaluation.
MAX_INT_BITS = 8192
MAX_FUNCTION_ARGS = 32

# Symbols models write that mean Python operators. "^" is power in calculator notation (and has
# power's right associativity once spelled "**"); Python's bitwise xor is not supported anyway.
_SPELLINGS = {"^": "**", "×": "*", "·": "*", "÷": "/", "−": "-"}


class CalculatorError(ValueError):
    """The expression cannot be evaluated; the message says why, for the model to read."""


@dataclass(frozen=True)
class Function:
    fn: Callable[..., Number]
    min_args: int
    max_args: int


def _factorial(n: Number) -> int:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0:
        raise CalculatorError("factorial() needs a non-negative integer")
    if n > 1 and math.lgamma(n + 1) / math.log(2) > MAX_INT_BITS:
        raise CalculatorError(f"factorial({n}) is too large (more than {MAX_INT_BITS} bits)")
    return math.factorial(n)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise CalculatorError("round() needs an integer number of digits")
    return round(x, max(-MAX_INT_BITS, min(ndigits, 400)))


FUNCTIONS: dict[str, Function] = {
    "abs": Function(abs, 1, 1),
    "round": Function(_round, 1, 2),
    "min": Function(min, 1, MAX_FUNCTION_ARGS),
    "max": Function(max, 1, MAX_FUNCTION_ARGS),
    "floor": Function(math.floor, 1, 1),
    "ceil": Function(math.ceil, 1, 1),
    "sqrt": Function(math.sqrt, 1, 1),
    "exp": Function(math.exp, 1, 1),
    "log": Function(math.log, 1, 2),
    "log2": Function(math.log2, 1, 1),
    "log10": Function(math.log10, 1, 1),
    "sin": Function(math.sin, 1, 1),
    "cos": Function(math.cos, 1, 1),
    "tan": Function(math.tan, 1, 1),
    "asin": Function(math.asin, 1, 1),
    "acos": Function(math.acos, 1, 1),
    "atan": Function(math.atan, 1, 1),
    "factorial": Function(_factorial, 1, 1),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

_ALLOWED = (
    "numbers, + - * / // % ** (or ^), parentheses, the constants "
    + ", ".join(CONSTANTS)
    + " and the functions "
    + ", ".join(FUNCTIONS)
)


def _checked(value: Number) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError(f"the result is not a real number ({type(value).__name__})")
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise CalculatorError(f"the result is too large (more than {MAX_INT_BITS} bits)")
    elif not math.isfinite(value):
        raise CalculatorError("the result is too large (overflows a float)")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    if base < 0 and isinstance(exponent, float) and not exponent.is_integer():
        raise CalculatorError("a negative number to a fractional power has no real result")
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        if abs(base) > 1:
            bits = exponent * math.log2(abs(base))  # bit length of the result, before computing it
            if bits > MAX_INT_BITS:
                raise CalculatorError(
                    f"{base}**{exponent} is too large (about {bits:.3g} bits; the limit is {MAX_INT_BITS})"
                )
        return base**exponent
    # math.pow raises for complex results and overflow instead of returning complex or inf.
    return math.pow(base, exponent)


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, ast.Div):
        return left / right
    if isinstance(op, ast.FloorDiv):
        return left // right
    if isinstance(op, ast.Mod):
        return left % right
    if isinstance(op, ast.Pow):
        return _power(left, right)
    raise CalculatorError(f"not allowed: the operator {type(op).__name__}; allowed: {_ALLOWED}")


class _Evaluator:
    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CalculatorError(f"{value!r} is not a number; allowed: {_ALLOWED}")
            return _checked(value)
        if isinstance(node, ast.BinOp):
            return _checked(_binary(node.op, self.eval(node.left), self.eval(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = self.eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else +value
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return CONSTANTS[node.id]
            hint = f"; did you mean {node.id}(...)?" if node.id in FUNCTIONS else ""
            raise CalculatorError(f"unknown name {node.id!r}{hint}; allowed: {_ALLOWED}")
        if isinstance(node, ast.Call):
            return self.call(node)
        raise CalculatorError(f"not allowed: {_describe(node)}; allowed: {_ALLOWED}")

    def call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise CalculatorError(f"only these functions can be called: {', '.join(FUNCTIONS)}")
        name, spec = node.func.id, FUNCTIONS[node.func.id]
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise CalculatorError(f"{name}() takes positional arguments only")
        if not spec.min_args <= len(node.args) <= spec.max_args:
            wanted = (
                str(spec.min_args)
                if spec.min_args == spec.max_args
                else f"{spec.min_args} to {spec.max_args}"
            )
            raise CalculatorError(f"{name}() takes {wanted} argument(s), got {len(node.args)}")
        args = [self.eval(a) for a in node.args]
        return _checked(spec.fn(*args))


def _describe(node: ast.AST) -> str:
    names = {
        ast.Attribute: "attribute access",
        ast.Subscript: "subscripts",
        ast.Compare: "comparisons",
        ast.BoolOp: "boolean operators",
        ast.Lambda: "lambda",
        ast.IfExp: "conditional expressions",
        ast.Tuple: "tuples (a comma outside a function call)",
        ast.List: "lists",
        ast.Dict: "dicts",
        ast.Set: "sets",
        ast.ListComp: "comprehensions",
        ast.SetComp: "comprehensions",
        ast.DictComp: "comprehensions",
        ast.GeneratorExp: "comprehensions",
        ast.JoinedStr: "strings",
        ast.NamedExpr: "assignment",
        ast.Await: "await",
        ast.Yield: "yield",
        ast.Starred: "unpacking",
    }
    if isinstance(node, ast.UnaryOp):
        return "the operator " + {ast.Not: "not", ast.Invert: "~"}.get(type(node.op), type(node.op).__name__)
    return names.get(type(node), type(node).__name__)


def _check_shape(tree: ast.AST) -> None:
    """Node count and depth, measured without recursion (the tree may be deep)."""
    count, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise CalculatorError(f"the expression is too long (more than {MAX_NODES} syntax nodes)")
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def normalize(expression: str) -> str:
    text = expression.strip()
    for symbol, python in _SPELLINGS.items():
        text = text.replace(symbol, python)
    return text


def evaluate(expression: str) -> Number:
    """Evaluate ``expression``; raises :class:`CalculatorError` (and nothing else) when it cannot."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"the expression is too long ({len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS})"
        )
    text = normalize(expression)
    if not text:
        raise CalculatorError("the expression is empty")
    try:
        with (
            warnings.catch_warnings()
        ):  # "invalid decimal literal" and the like: the model reads errors, not warnings
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"invalid syntax: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, huge literals, deep nesting
        raise CalculatorError(f"cannot parse the expression: {type(exc).__name__}: {exc}") from None
    _check_shape(tree)
    try:
        return _Evaluator().eval(tree)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large (overflows a float)") from None
    except ValueError:  # math domain errors: sqrt(-1), log(0), asin(2)
        raise CalculatorError("math domain error (a function got a value outside its domain)") from None
    except TypeError as exc:  # e.g. floor of a value it does not accept
        raise CalculatorError(str(exc)) from None


def format_number(value: Number) -> str:
    """Integers exactly; integral floats without ".0" (``10/2`` -> ``5``); other floats by repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
