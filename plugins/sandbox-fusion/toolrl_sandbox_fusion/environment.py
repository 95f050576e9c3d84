"""The ``python-math`` environment: generated problems whose answers take computation (sums of
primes, modular powers, digit sums of factorials, counting), solved by writing Python for the
``code_interpreter`` tool; the ``math`` reward checks the final ``\\boxed{}`` answer.

Train and test are disjoint by construction: each problem's text hashes into one of
``HELD_OUT_BUCKETS`` buckets, and bucket 0 is the test split's. ``scale`` sets the difficulty (how
large the numbers are). Answers are computed here in plain Python, with bounded cost.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment
from toolrl.schemas import Sample

HELD_OUT_BUCKETS = 8
INSTRUCTIONS = ("Write Python code that computes the answer and run it with the code_interpreter tool, "
                "then give the final answer as \\boxed{N}.")
Family = Literal["prime_sum", "power_mod", "factorial_digits", "divisible_count"]
FAMILIES: tuple[str, ...] = ("prime_sum", "power_mod", "factorial_digits", "divisible_count")


class PythonMathOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    families: list[Family] = Field(list(FAMILIES), min_length=1)
    scale: int = Field(2, ge=1, le=4, description="difficulty: how large the numbers are")
    train_size: int = Field(256, gt=0)
    test_size: int = Field(64, gt=0)
    seed: int = 0
    timeout: float = Field(10.0, gt=0, description="the code_interpreter's run time limit (s)")


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(n - 1) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, n, p)))
    return [i for i in range(n) if sieve[i]]


def _prime_sum(rng: random.Random, scale: int) -> tuple[str, int]:
    n = rng.randint(10 ** (scale + 1), 5 * 10 ** (scale + 1))
    return f"What is the sum of all prime numbers below {n}?", sum(_primes_below(n))


def _power_mod(rng: random.Random, scale: int) -> tuple[str, int]:
    a, b = rng.randint(2, 10 ** scale * 9), rng.randint(10 ** (scale + 1), 10 ** (scale + 3))
    m = rng.randint(10 ** (scale + 2), 10 ** (scale + 3))
    return f"What is {a}^{b} modulo {m}?", pow(a, b, m)


def _factorial_digits(rng: random.Random, scale: int) -> tuple[str, int]:
    n = rng.randint(10 * scale, 60 * scale)
    return f"What is the sum of the decimal digits of {n}! ({n} factorial)?", sum(map(int, str(math.factorial(n))))


def _divisible_count(rng: random.Random, scale: int) -> tuple[str, int]:
    n = rng.randint(10 ** (scale + 2), 10 ** (scale + 3))
    a, b, c = rng.sample(range(3, 30), 3)
    return (f"How many integers from 1 to {n} (inclusive) are divisible by {a} or by {b}, but not by {c}?",
            divisible_count(n, a, b, c))


def divisible_count(n: int, a: int, b: int, c: int) -> int:
    """Integers in 1..n divisible by a or b and not by c, by inclusion-exclusion."""
    either = n // a + n // b - n // math.lcm(a, b)
    also_c = n // math.lcm(a, c) + n // math.lcm(b, c) - n // math.lcm(a, b, c)
    return either - also_c


GENERATORS: dict[str, Callable[[random.Random, int], tuple[str, int]]] = {
    "prime_sum": _prime_sum, "power_mod": _power_mod, "factorial_digits": _factorial_digits,
    "divisible_count": _divisible_count,
}


def held_out(question: str) -> bool:
    """Whether ``question`` belongs to the test split (a stable hash, the same on every machine)."""
    return int.from_bytes(hashlib.blake2b(question.encode(), digest_size=8).digest(), "big") % HELD_OUT_BUCKETS == 0


def problems(options: PythonMathOptions, split: str) -> list[Sample]:
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    test = split == "test"
    size = options.test_size if test else options.train_size
    rng = random.Random(f"{options.seed}:{split}")
    seen: set[str] = set()
    samples: list[Sample] = []
    for _ in range(100 * size):  # rejection sampling: a draw in the other split's buckets is skipped
        if len(samples) == size:
            break
        family = rng.choice(options.families)
        question, answer = GENERATORS[family](rng, options.scale)
        if held_out(question) != test or question in seen:
            continue
        seen.add(question)
        samples.append(Sample(prompt=[{"role": "user", "content": question}], ground_truth=str(answer),
                              data_source=f"toolrl/python-math/{family}", index=len(samples)))
    return samples


def configure(options: PythonMathOptions) -> dict[str, Any]:
    return {"tools": [{"class_name": "code_interpreter",
                       "config": {"type": "native", "default_timeout": options.timeout}}]}


PYTHON_MATH = Environment(
    name="python-math",
    description="Generated problems that need computation, solved with Python in the code_interpreter sandbox.",
    splits={"train": problems, "test": problems},
    instructions=INSTRUCTIONS,
    tools=[{"class_name": "code_interpreter", "config": {"type": "native", "default_timeout": 10.0}}],
    rewards=[{"name": "math", "weight": 1.0}],
    parser="hermes",
    max_turns=4,
    metric="math",
    options=PythonMathOptions,
    configure=configure,
)
