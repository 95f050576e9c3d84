"""The ``corridor`` environment: a row of ``rooms`` named rooms, the exit through the east door of the
last one. Each model turn is one ``move`` (``east`` or ``west``); the episode is solved when the model
walks out of the exit within ``max_turns`` (``turns_per_room`` × ``rooms``), and its only reward is
then, 1 (0 otherwise): no step rewards. A wrong move (``west``) is recoverable but costs two turns
(the step back and the step to undo it), so a mistake early is paid for at the end; the session's
state key is the room, so every trajectory of a group passes through the same anchor states
(``gigpo``'s step groups), some more than once.

``doors`` makes the right move depend on the room: each room has one door on (to the next room, out of
the last) and one back, ``east`` or ``west`` by room (``alternate``: east from the even rooms, west from
the odd ones; ``random``: drawn once per room name from ``seed``, the same in every corridor of both
splits, so a model can learn a name's door and the test split asks for it on new corridors). The
samples carry the doors (``extra_info.doors``); a won walk then holds both moves, each right in some
rooms, so an outcome says little about any one turn.

Calls are inline tags (``<move>east</move>``). Train and test are disjoint by construction: every
corridor (its rooms' names) hashes into one of ``HELD_OUT_BUCKETS`` buckets, bucket 0 is the test
split's.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment
from toolrl.schemas import Sample

HELD_OUT_BUCKETS = 8  # one corridor in 8 is held out for the test split
ROOM_NAMES = ("hall", "library", "kitchen", "cellar", "attic", "pantry", "study", "gallery", "chapel", "armory",
              "vault", "garden", "tower", "forge", "stable", "bakery", "office", "lounge", "nursery", "parlor",
              "cloister", "dungeon", "foyer", "larder", "loft", "mill", "observatory", "orchard", "quarry",
              "sauna", "scullery", "smithy", "solar", "studio", "workshop", "ballroom", "bathhouse", "crypt")
SYSTEM_PROMPT = ("You walk through a row of rooms to the exit, east of the last room. Each turn, move one room "
                 "with <move>east</move> or <move>west</move>.")
DOORS_PROMPT = ("You walk through a row of rooms to the exit, past the last room. Each room has two doors, east "
                "and west: one leads on to the next room, the other back. Each turn, go through one with "
                "<move>east</move> or <move>west</move>.")
TAG_ROUTES = {"tags": {"move": {"tool": "move", "argument": "direction"}}, "fences": {}}


class CorridorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rooms: int = Field(5, ge=2, le=12, description="rooms in the row: the moves a perfect walk takes")
    turns_per_room: int = Field(2, ge=1, le=4, description="max_turns = turns_per_room × rooms (2: a random "
                                "walk at even odds gets out about 1 time in 6 with 5 rooms)")
    train_size: int = Field(512, gt=0)
    test_size: int = Field(64, gt=0)
    seed: int = 0
    key_turns: bool = Field(False, description="the session's state key also counts the moves made")
    doors: Literal["east", "alternate", "random"] = Field("east", description="which door of each room leads "
                                                          "on: east everywhere, alternate (east from even "
                                                          "rooms), or random (per room name, from seed)")
    example: bool = Field(False, description="a worked walk before each problem (a small instruct model writes "
                          "no <move> call without one)")


def question(names: list[str], doors: str = "east") -> str:
    exit_ = f"east of the {names[-1]}" if doors == "east" else f"through the {names[-1]}'s door on"
    return f"You are in the {names[0]}, the first of {len(names)} rooms in a row: {', '.join(names)}. The exit is {exit_}."


def door_plan(names: list[str], options: CorridorOptions) -> list[str]:
    """The door on from each room of ``names`` (``east`` or ``west``), as ``options.doors`` says."""
    if options.doors == "alternate":
        return ["east" if i % 2 == 0 else "west" for i in range(len(names))]
    if options.doors == "random":  # str seeds hash stably (sha512): the same plan on every machine
        return [random.Random(f"{options.seed}:door:{name}").choice(("east", "west")) for name in names]
    return ["east"] * len(names)


def held_out(names: list[str]) -> bool:
    """Whether a corridor belongs to the test split (a stable hash, the same on every machine)."""
    digest = hashlib.blake2b(" ".join(names).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def corridors(options: CorridorOptions, split: str) -> list[Sample]:
    """``split``'s corridors: the question, and the rooms' names in ``extra_info``."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    test = split == "test"
    size = options.test_size if test else options.train_size
    rng = random.Random(f"{options.seed}:{split}:{options.rooms}")
    chosen: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    while len(chosen) < size:
        names = rng.sample(ROOM_NAMES, options.rooms)
        if held_out(names) != test or (test and tuple(names) in seen):
            continue
        seen.add(tuple(names))
        chosen.append(names)
    return [Sample(prompt=[{"role": "user", "content": question(names, options.doors)}], ground_truth="exit",
                   extra_info={"rooms": names, "doors": door_plan(names, options)}, data_source="toolrl/corridor",
                   index=i)
            for i, names in enumerate(chosen)]


EXAMPLE_ROOMS = ["porch", "hallway", "den"]  # the worked walk's (names no problem uses)


def worked_example(options: CorridorOptions) -> list[dict[str, Any]]:
    """A walk out of a 3-room corridor through its doors on, rendered as the tags parser inserts results."""
    seen = [f"You are in the {name}, room {i + 1} of 3." for i, name in enumerate(EXAMPLE_ROOMS[1:], 1)]
    text = "".join(f"<move>{door}</move>\n```output\n{result}\n```\n"
                   for door, result in zip(door_plan(EXAMPLE_ROOMS, options), [*seen, "You walk out through the exit."]))
    return [{"role": "user", "content": question(EXAMPLE_ROOMS, options.doors)},
            {"role": "assistant", "content": text.rstrip()}]


def configure(options: CorridorOptions) -> dict[str, Any]:
    return {"max_turns": options.turns_per_room * options.rooms, "session_options": {"key_turns": options.key_turns},
            "prompt_prefix": worked_example(options) if options.example else [],
            "system_prompt": SYSTEM_PROMPT if options.doors == "east" else DOORS_PROMPT}


CORRIDOR = Environment(
    name="corridor",
    description="Walk a row of rooms to the exit with a stateful move tool: one reward at the exit, wrong moves "
                "cost turns, the room is the state key (turn-level credit); `rooms` sets the length, `doors` which door leads on.",
    splits={"train": corridors, "test": corridors},
    system_prompt=SYSTEM_PROMPT,
    session="corridor",
    parser="tags",
    parser_options=TAG_ROUTES,
    max_turns=10,
    metric="corridor",
    options=CorridorOptions,
    configure=configure,
)
