"""The ``bfcl`` environment: BFCL's categories as training and test splits, each sample one entry, each
trajectory a ``bfcl`` session (its functions as tools, BFCL's verdict as its score).

The splits name categories (or BFCL's groups: ``live``, ``non_live``, ``multi_turn``); by default it
trains on the live single-turn categories and tests on the non-live ones, which share no entry id (live
entries were contributed by users, non-live ones written by BFCL's authors; six user questions recur, two as
the same task with the same functions: the README names them). ``per_category: N`` keeps N
entries of each category, spread evenly over its file; ``ids`` keeps only the entries named.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from toolrl.environments import Environment
from toolrl.schemas import Sample

from toolrl_bfcl import categories, upstream
from toolrl_bfcl.session import Format


class BfclOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train: list[str] = Field(default_factory=lambda: ["live_simple", "live_multiple", "live_parallel",
                                                      "live_parallel_multiple", "live_irrelevance"],
                             description="the training split's categories or groups", validate_default=True)
    test: list[str] = Field(default_factory=lambda: ["non_live"], description="the test split's categories",
                            validate_default=True)
    per_category: int | None = Field(None, gt=0, description="entries kept per category, spread evenly; "
                                     "all when unset")
    ids: list[str] | None = Field(None, description="only these entry ids (each split keeps its categories' ones)")
    max_prompt_chars: int | None = Field(None, gt=0, description="the training split leaves out entries whose "
                                         "prompt (question and function docs) is longer; the test split keeps all")
    format: Format = "prompting"
    docs: Literal["json", "python", "xml"] = Field("json", description="how BFCL's prompt documents the functions "
                                                   "under format prompting: json (BFCL's default) or a variant its "
                                                   "format-sensitivity category measures")
    reward: Literal["verdict", "shaped"] = "verdict"
    max_steps: int = Field(20, gt=0)

    @field_validator("train", "test")
    @classmethod
    def _categories(cls, names: list[str]) -> list[str]:
        return categories.expand(names)

    @model_validator(mode="after")
    def _ids_exist(self) -> BfclOptions:
        for entry_id in self.ids or []:
            try:
                categories.entry(entry_id)
            except KeyError:
                raise ValueError(f"ids: no BFCL entry {entry_id!r}") from None
            except upstream.BfclMissing as exc:
                raise ValueError(str(exc)) from None
        return self


def spread(items: tuple[Any, ...], n: int | None) -> list[Any]:
    """``n`` of ``items`` at evenly spaced positions (all of them when n is None or not smaller)."""
    if n is None or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def prompt_chars(entry: dict[str, Any]) -> int:
    """The characters of an entry's first turn and function docs (what its prompt grows with)."""
    return sum(len(str(m.get("content", ""))) for m in entry["question"][0]) + len(json.dumps(entry["function"]))


def sample(entry: dict[str, Any], category: str, options: BfclOptions, index: int) -> Sample:
    """One entry as a training or test sample: its first user turn (with BFCL's prompt under
    ``prompting``), the entry id as ground truth."""
    first = entry["question"][0]
    prompt = upstream.prompting_messages(first, entry["function"], options.docs) if options.format == "prompting" \
        else [dict(m) for m in first]
    return Sample(prompt=prompt, ground_truth={"id": entry["id"]}, data_source=f"bfcl/{category}", index=index,
                  extra_info={"category": category})


def tasks(options: BfclOptions, split: str) -> list[Sample]:
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    wanted = set(options.ids) if options.ids is not None else None
    out: list[Sample] = []
    limit = options.max_prompt_chars if split == "train" else None
    for category in (options.train if split == "train" else options.test):
        kept = [e for e in categories.entries(category) if (wanted is None or e["id"] in wanted)
                and (limit is None or prompt_chars(e) <= limit)]
        out += [sample(e, category, options, len(out) + i)
                for i, e in enumerate(spread(tuple(kept), options.per_category))]
    return out


# The most user turns of any multi-turn entry (miss_func and miss_param; 7 in the others).
MOST_USER_TURNS = 8


def configure(options: BfclOptions) -> dict[str, Any]:
    multi_turn = any(categories.KINDS[c] == "multi_turn" for c in options.train + options.test)
    # A single-turn entry ends itself after one model turn; a multi-turn one takes up to max_steps call turns
    # and an answer in each user turn.
    return {"session_options": {"format": options.format, "reward": options.reward, "max_steps": options.max_steps},
            "parser": "pythonic" if options.format == "prompting" else "hermes",
            # BFCL's multi-turn answers call one-parameter functions positionally (sort('a.txt')).
            "parser_options": {"positional": True} if options.format == "prompting" else {},
            "max_turns": MOST_USER_TURNS * (options.max_steps + 2) if multi_turn else 1}


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from toolrl_bfcl.report import leaderboard

    return leaderboard(rows)


BFCL = Environment(
    name="bfcl",
    description="the Berkeley Function Calling Leaderboard (bfcl-eval): its single-turn and multi-turn "
                "categories, each entry's functions as tools, BFCL's own checker as the score",
    splits={"train": tasks, "test": tasks},
    session="bfcl",
    parser="pythonic",
    max_turns=1,
    metric="bfcl",
    options=BfclOptions,
    configure=configure,
    report=report,
)
