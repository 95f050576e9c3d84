"""The ``duo`` environment: short word problems for a planner and an executor (``toolrl_duo.agent``).

Each problem is one sentence about two two-digit numbers whose answer is ``a + b``, ``a - b`` or
``a * b``, told in one of a few phrasings per operation (``TEMPLATES``). The planner turns it into an
arithmetic expression, the executor runs the calculator on that expression and answers; the sample
carries the answer (``ground_truth``) and one right expression (``extra_info.expression``). Train and
test are disjoint by construction: every problem (phrasing and numbers) hashes into one of
``HELD_OUT_BUCKETS`` buckets, bucket 0 is the test split's; the phrasings are the same in both, so the
test split asks for the mapping learnt on new numbers.
"""

from __future__ import annotations

import hashlib
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment
from toolrl.schemas import Sample

Operator = Literal["+", "-", "*"]
# The executor's inline calculator call, which the run's tags parser turns into a function call.
TAG_ROUTES = {"tags": {"calculator": {"tool": "calculator", "argument": "expression"}}, "fences": {}}
HELD_OUT_BUCKETS = 8  # one problem in 8 is held out for the test split
# Per operation, phrasings of `a op b` (a > b for "-", so every answer is a whole, non-negative count).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": ("A shelf holds {a} books and {b} more books are put on it. How many books are on the shelf?",
          "Sam has {a} stamps and buys {b} more. How many stamps does Sam have now?",
          "A farm has {a} cows and {b} sheep. How many animals does the farm have?"),
    "-": ("A tank holds {a} litres and {b} litres leak out. How many litres are left?",
          "Ann had {a} coins and spent {b} of them. How many coins does Ann have left?",
          "A train carries {a} people and {b} get off. How many people are still on the train?"),
    "*": ("A crate holds {a} bottles. How many bottles are in {b} crates?",
          "Each of {a} buses carries {b} children. How many children ride the buses?",
          "A garden has {a} rows of {b} tulips. How many tulips grow in the garden?"),
}
VALUES = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class DuoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operators: list[Operator] = Field(["+", "-", "*"], min_length=1, description="the operations asked")
    train_size: int = Field(512, gt=0)
    test_size: int = Field(64, gt=0, le=2048, description="distinct held-out problems")
    seed: int = 0


def held_out(op: str, phrasing: int, a: int, b: int) -> bool:
    """Whether a problem belongs to the test split (a stable hash, the same on every machine)."""
    digest = hashlib.blake2b(f"{op}{phrasing}:{a}:{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def problems(options: DuoOptions, split: str) -> list[Sample]:
    """``split``'s word problems: the question, the answer, and a right expression in ``extra_info``."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    test = split == "test"
    size = options.test_size if test else options.train_size
    rng = random.Random(f"{options.seed}:{split}")
    chosen: list[tuple[str, int, int, int]] = []
    seen: set[tuple[str, int, int, int]] = set()
    while len(chosen) < size:  # train draws with repetition; the test split keeps distinct problems
        op = rng.choice(options.operators)
        problem = (op, rng.randrange(len(TEMPLATES[op])), *sorted((rng.randint(10, 99), rng.randint(10, 99)),
                                                                    reverse=op == "-"))
        if held_out(*problem) != test or (test and problem in seen) or (op == "-" and problem[2] == problem[3]):
            continue
        seen.add(problem)
        chosen.append(problem)
    return [Sample(prompt=[{"role": "user", "content": TEMPLATES[op][phrasing].format(a=a, b=b)}],
                   ground_truth=str(VALUES[op](a, b)), extra_info={"expression": f"{a} {op} {b}"},
                   data_source="toolrl/duo", index=i)
            for i, (op, phrasing, a, b) in enumerate(chosen)]


DUO = Environment(
    name="duo",
    description="Two-number word problems for a planner (writes the expression) and an executor (runs the "
                "calculator on it and answers): the data of the toolrl_duo.agent program.",
    splits={"train": problems, "test": problems},
    parser="tags",
    parser_options=TAG_ROUTES,
    options=DuoOptions,
)
