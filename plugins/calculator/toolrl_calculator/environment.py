"""The ``arithmetic`` environment: synthetic ``What is 37 * 58?`` questions answered with the
calculator tool, scored by the number in the final answer.

``digits`` sets the difficulty (operands have that many digits; with 1, 2 to 9). Train and test are
disjoint by construction: every problem (``a op b``) hashes into one of ``HELD_OUT_BUCKETS``
buckets, and bucket 0 is the test split's. The test split holds distinct problems; the training
split draws with repetition from the rest.

``format`` picks how the model calls the calculator: ``hermes`` (``<tool_call>`` JSON through the
chat template) or ``tags`` (inline ``<calculator>…</calculator>``, taught by a worked example).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment
from toolrl.schemas import Sample

HELD_OUT_BUCKETS = 8  # one problem in 8 is held out for the test split
INSTRUCTIONS = {
    "hermes": "Use the calculator tool, then give the final answer as: The answer is N.",
    "tags": "Use the calculator, then reply with: The answer is N.",
}
TAG_SYSTEM_PROMPT = ("You are a careful assistant. Never compute in your head: write the expression in "
                     "<calculator></calculator> tags and the calculator's result appears after it.")
# The inline route the tags parser needs for this environment's one tool.
TAG_ROUTES = {"tags": {"calculator": {"tool": "calculator", "argument": "expression"}}, "fences": {}}


class ArithmeticOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    digits: int = Field(2, ge=1, le=9, description="digits per operand: the difficulty")
    operators: list[Literal["+", "-", "*"]] = Field(["+", "-", "*"], min_length=1)
    train_size: int = Field(512, gt=0)
    test_size: int = Field(128, gt=0, description="at most the distinct held-out problems there are")
    seed: int = 0
    format: Literal["hermes", "tags"] = "hermes"
    instructions: str | None = Field(None, description="default: the format's calculator instruction")


def _operands(digits: int) -> tuple[int, int]:
    return (2 if digits == 1 else 10 ** (digits - 1)), 10 ** digits - 1


def held_out(a: int, op: str, b: int) -> bool:
    """Whether ``a op b`` belongs to the test split (a stable hash, the same on every machine)."""
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def problems(options: ArithmeticOptions, split: str) -> list[Sample]:
    """``split``'s questions with the integer result as ground truth."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    test = split == "test"
    size = options.test_size if test else options.train_size
    low, high = _operands(options.digits)
    ops = options.operators
    rng = random.Random(f"{options.seed}:{split}")
    if test and (high - low + 1) ** 2 * len(ops) <= 100_000:  # small space: every held-out problem
        pool = [(a, op, b) for op in ops for a in range(low, high + 1) for b in range(low, high + 1)
                if held_out(a, op, b)]
        rng.shuffle(pool)
        chosen = pool[:size]
    else:  # rejection sampling; the test split keeps distinct problems
        chosen, seen = [], set()
        for _ in range(100 * size):
            if len(chosen) == size:
                break
            problem = (rng.randint(low, high), rng.choice(ops), rng.randint(low, high))
            if held_out(*problem) != test or (test and problem in seen):
                continue
            seen.add(problem)
            chosen.append(problem)
    return [Sample(prompt=[{"role": "user", "content": f"What is {a} {op} {b}?"}],
                   ground_truth=str({"+": a + b, "-": a - b, "*": a * b}[op]),
                   data_source="toolrl/arithmetic", index=i)
            for i, (a, op, b) in enumerate(chosen)]


def configure(options: ArithmeticOptions) -> dict[str, Any]:
    changes: dict[str, Any] = {"instructions": options.instructions or INSTRUCTIONS[options.format]}
    if options.format == "tags":
        # A worked example of the inline call format: small models imitate it.
        example = f"What is 12 * 34? {changes['instructions']}"
        changes.update(parser="tags", parser_options=TAG_ROUTES, system_prompt=TAG_SYSTEM_PROMPT, prompt_prefix=[
            {"role": "user", "content": example},
            {"role": "assistant", "content": "<calculator>12 * 34</calculator>\n```output\n408\n```\nThe answer is 408."},
        ])
    return changes


ARITHMETIC = Environment(
    name="arithmetic",
    description="Synthetic integer arithmetic (+, -, *) answered with the calculator tool; `digits` sets the difficulty.",
    splits={"train": problems, "test": problems},
    instructions=INSTRUCTIONS["hermes"],
    tools=[{"class_name": "calculator", "config": {"type": "native", "timeout": 5}}],
    rewards=[{"name": "gsm8k", "weight": 1.0, "options": {"method": "flexible"}}],
    parser="hermes",
    max_turns=3,
    metric="gsm8k",
    options=ArithmeticOptions,
    configure=configure,
)
