"""The ``lookup-chain`` environment: each problem is a chain of keys, ``owl -> 58 -> 731``, that the
model follows with the ``lookup`` tool one hop at a time (a key is only known once an earlier lookup
revealed it), then answers the value with the ``answer`` tool. Solving takes ``hops`` lookups and an
answer: ``hops + 1`` calls in ``hops + 1`` model turns, with the state (the keys revealed so far) kept
per trajectory by the ``lookup-chain`` session (:mod:`toolrl_lookup.session`).

Calls are inline tags (``<lookup>owl</lookup>``, ``<answer>731</answer>``), taught by one worked
example (a chain one hop longer than the problems' by default): small models such as SmolLM2-135M imitate it (the quickstart measured that they do not
produce hermes JSON calls). Train and test are disjoint by construction: every chain hashes into one
of ``HELD_OUT_BUCKETS`` buckets, and bucket 0 is the test split's.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment
from toolrl.schemas import Sample

HELD_OUT_BUCKETS = 8  # one chain in 8 is held out for the test split
START_KEYS = ("owl", "fox", "cat", "dog", "bee", "elk", "emu", "yak", "ant", "bat", "cow", "eel", "hen", "pig",
              "ram", "rat", "ape", "cod", "jay", "koi", "asp", "doe", "gnu", "hog", "kit", "ewe", "tit", "wren",
              "lark", "mole", "moth", "newt", "seal", "swan", "toad", "wolf", "crab", "deer", "duck", "frog",
              "goat", "hare", "ibis", "lion", "lynx", "mink", "puma", "wasp")
SYSTEM_PROMPT = ("You find a value by following keys. Write a key in <lookup></lookup> tags and its entry appears "
                 "after it: the next key, or the value. Give the value in <answer></answer> tags.")
# The inline routes the tags parser needs for the session's two tools.
TAG_ROUTES = {"tags": {"lookup": {"tool": "lookup", "argument": "key"},
                       "answer": {"tool": "answer", "argument": "value"}}, "fences": {}}
EXAMPLE_CHAIN = ["kiwi", "58", "23", "41", "731"]  # the worked example's (a start no problem uses)


class ChainOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hops: int = Field(2, ge=1, le=4, description="lookups per chain: the difficulty (solving takes hops + 1 calls)")
    train_size: int = Field(512, gt=0)
    test_size: int = Field(64, gt=0)
    seed: int = 0
    max_failures: int = Field(2, ge=0, description="lookups of unknown keys allowed; one more loses the episode")
    progress: float = Field(0.2, ge=0, lt=1, description="reward of an unsolved episode per share of hops looked "
                            "up (0: solved or not)")
    example_hops: int | None = Field(None, ge=1, le=4, description="lookups in the worked example; default "
                                     "hops + 1 (SmolLM2-135M answers after one lookup when it shows hops)")


def question(start: str) -> str:
    return f"Start at key {start}. Look up keys until you reach the value, then answer it."


def entry(chain: list[str], position: int) -> str:
    """What looking up ``chain[position]`` shows: the next key, or the value at the chain's end."""
    if position + 2 == len(chain):
        return f"{chain[position]}: the value is {chain[position + 1]}"
    return f"{chain[position]}: look up {chain[position + 1]} next"


def held_out(chain: list[str]) -> bool:
    """Whether a chain belongs to the test split (a stable hash, the same on every machine)."""
    digest = hashlib.blake2b(" ".join(chain).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def _chain(rng: random.Random, hops: int) -> list[str]:
    keys = rng.sample(range(10, 100), hops - 1)  # distinct two-digit keys between start and value
    return [rng.choice(START_KEYS), *map(str, keys), str(rng.randint(100, 999))]


def chains(options: ChainOptions, split: str) -> list[Sample]:
    """``split``'s problems: the question, the value as ground truth and the chain in ``extra_info``."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    test = split == "test"
    size = options.test_size if test else options.train_size
    rng = random.Random(f"{options.seed}:{split}:{options.hops}")
    chosen: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    while len(chosen) < size:
        chain = _chain(rng, options.hops)
        if held_out(chain) != test or (test and tuple(chain) in seen):
            continue
        seen.add(tuple(chain))
        chosen.append(chain)
    return [Sample(prompt=[{"role": "user", "content": question(c[0])}], ground_truth=c[-1],
                   extra_info={"chain": c}, data_source="toolrl/lookup-chain", index=i)
            for i, c in enumerate(chosen)]


def worked_example(hops: int) -> list[dict[str, Any]]:
    """A solved problem of ``hops`` lookups, rendered as the tags parser inserts results."""
    chain = EXAMPLE_CHAIN[:hops] + EXAMPLE_CHAIN[-1:]
    text = "".join(f"<lookup>{chain[i]}</lookup>\n```output\n{entry(chain, i)}\n```\n" for i in range(hops))
    return [{"role": "user", "content": question(chain[0])},
            {"role": "assistant", "content": f"{text}<answer>{chain[-1]}</answer>"}]


def configure(options: ChainOptions) -> dict[str, Any]:
    # Measured on 16 held-out 2-hop chains, greedy: with a 2-hop example SmolLM2-135M-Instruct answers the
    # first key it reads (0 of 16 solved); with a 3-hop example it looks up again (5 of 16).
    example = options.example_hops or options.hops + 1
    return {"prompt_prefix": worked_example(example), "max_turns": options.hops + 2,
            "session_options": {"max_failures": options.max_failures, "progress": options.progress}}


LOOKUP_CHAIN = Environment(
    name="lookup-chain",
    description="Follow a chain of keys with a stateful lookup tool (each key revealed by the previous lookup), "
                "then answer the value; `hops` sets the difficulty.",
    splits={"train": chains, "test": chains},
    system_prompt=SYSTEM_PROMPT,
    session="lookup-chain",
    parser="tags",
    parser_options=TAG_ROUTES,
    max_turns=4,
    options=ChainOptions,
    configure=configure,
)
