"""The ``ledger`` environment: read every page of a ledger (``pages`` tool calls, each result about
1k tokens with the default ``rows``), then report the audit key stated on page 1. A model whose
context holds a few pages cannot keep page 1 in view: the task is for context policies
(``rollout.context``, docs/rollouts.md). Scored by the ``gsm8k`` reward (the key is the last number
of the answer)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment
from toolrl.schemas import Sample

from toolrl_ledger.pages import audit_key

INSTRUCTIONS = ("Read every page of the ledger with read_page, one page per turn, from page 1 to page {pages}. "
                "Then report the audit key stated on page 1 as: The audit key is N.")


class LedgerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pages: int = Field(32, ge=1, le=1000, description="pages to read: tool calls per trajectory")
    rows: int = Field(32, ge=1, le=1000, description="entries per page (about 32 tokens each)")
    train_size: int = Field(256, gt=0)
    test_size: int = Field(32, gt=0)
    seed: int = 0


def ledgers(options: LedgerOptions, split: str) -> list[Sample]:
    """``split``'s ledgers: each its own seed (the test split's disjoint from training's)."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    size = options.test_size if split == "test" else options.train_size
    first = options.seed * 1_000_000 + (500_000 if split == "test" else 0)
    prompt = INSTRUCTIONS.format(pages=options.pages)
    return [Sample(prompt=[{"role": "user", "content": prompt}], ground_truth=str(audit_key(first + i)),
                   tools_kwargs={"read_page": {"create_kwargs": {"seed": first + i, "pages": options.pages,
                                                                 "rows": options.rows}}},
                   data_source="toolrl/ledger", index=i)
            for i in range(size)]


def configure(options: LedgerOptions) -> dict[str, Any]:
    # Every page is a call, with room for a context policy's summary turns.
    return {"max_turns": 2 * options.pages + 2}


LEDGER = Environment(
    name="ledger",
    description="Read a long ledger page by page (one tool call each, ~1k tokens per result), then report "
                "a value from page 1: a long-horizon task for context policies.",
    splits={"train": ledgers, "test": ledgers},
    system_prompt="You are a careful bookkeeper.",
    tools=[{"class_name": "read_page", "config": {"type": "native"}}],
    rewards=[{"name": "gsm8k", "weight": 1.0, "options": {"method": "flexible"}}],
    parser="hermes",
    max_turns=66,
    metric="gsm8k",
    options=LedgerOptions,
    configure=configure,
)
