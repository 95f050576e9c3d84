"""A ledger's pages, generated from its seed: page 1 states the audit key (the value the answer needs),
every page holds ``rows`` entries (about 32 tokens each with a Qwen tokenizer: a page of 32 is about 1k)."""

from __future__ import annotations

import random

ACCOUNTS = ("cash", "payroll", "rent", "supplies", "travel", "licences", "freight", "utilities")


def audit_key(seed: int) -> int:
    return random.Random(f"key:{seed}").randint(100_000, 999_999)


def page_text(seed: int, n: int, pages: int, rows: int) -> str:
    """Page ``n`` of ``pages`` of ledger ``seed``: a header, then its rows."""
    rng = random.Random(f"page:{seed}:{n}")
    head = f"Ledger page {n} of {pages}."
    if n == 1:
        head += f" The audit key is {audit_key(seed)}; keep it, the report needs it."
    lines = [f"{n}.{i:02d} 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.choice(ACCOUNTS)} "
             f"ACC-{rng.randint(1000, 9999)} {rng.randint(1, 99_999)}.{rng.randint(0, 99):02d}"
             for i in range(rows)]
    return "\n".join([head, *lines])
