"""The ``textworld`` environment: TextWorld games generated from options, each sample one game played by
a ``textworld`` session (toolrl_textworld.session).

``kind`` and its knobs make the games (toolrl_textworld.games): ``custom`` (``rooms``, ``objects``,
``quest_length``) or ``treasure_hunter`` (``level`` 1–30). The training split holds ``train_size`` games
a level, the test split ``test_size``: seeds drawn apart by split from ``seed``, and a training game
that is the same game as a held-out one (same world and quests) is dropped, so the held-out games are
never trained on. ``levels`` makes one knob the environment's difficulty levels (``data.curriculum:
{name: env_difficulty}``): ``{quest_length: [1, 2, 3]}`` gives each level its games.

Each model turn is one command (``max_steps`` turns at most). ``answer: number`` (the default) lists
the admissible commands numbered, and the model answers a number, as ALFWorld agents pick from a menu;
``text`` reads the command typed; ``tool`` reads an ``act`` call in the model family's format. Long
games take a context policy as any environment does (``context`` in the config).
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from toolrl.environments import Environment
from toolrl.schemas import Sample

from toolrl_textworld.games import KNOBS, REFUSED, GameSpec, digest, ensure
from toolrl_textworld.session import Play, TextworldSessionOptions

SYSTEM_PROMPTS = {
    "number": "You are playing a text adventure game. Each turn, answer with the number of one of the listed "
              "commands, nothing else.",
    "text": "You are playing a text adventure game. Each turn, answer with one command (such as 'go north' or "
            "'take key') on one line, nothing else.",
    "tool": "You are playing a text adventure game. Each turn, call the act tool with one command (such as "
            "'go north' or 'take key').",
}
EXAMPLE_SEED = 2**31  # the worked example's game: the splits draw their seeds below it


class TextworldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field("custom", description="custom or treasure_hunter")
    rooms: int = Field(2, ge=1, le=20, description="custom: rooms in the world")
    objects: int = Field(2, ge=0, le=30, description="custom: objects in the world (more are added for the quest)")
    quest_length: int = Field(2, ge=1, le=30, description="custom: commands the quest takes")
    level: int = Field(1, ge=1, le=30, description="treasure_hunter: its difficulty level")
    levels: dict[str, list[int]] | None = Field(None, description="one knob's values, easiest first: the "
                                                "environment's difficulty levels")
    seed: int = Field(0, ge=0)
    train_size: int = Field(32, gt=0, description="training games a level")
    test_size: int = Field(16, gt=0, description="held-out games a level")
    max_steps: int = Field(20, gt=0, description="model turns a game: a command each")
    commands: Literal["all", "actions", "none"] = Field("all", description="the admissible commands listed after "
                                                        "each view: all, those that can change the state, none")
    answer: Literal["number", "text", "tool"] = "number"
    reward: Literal["score", "progress"] = "score"
    order: Literal["textworld", "shuffled"] = Field("textworld", description="the menu's order: TextWorld's "
                                                    "(alphabetical) or shuffled by the state")
    example: bool = Field(True, description="a worked game (won by its walkthrough) before each one")

    @model_validator(mode="after")
    def _check(self) -> TextworldOptions:
        if self.kind in REFUSED:
            raise ValueError(f"kind {self.kind!r}: {REFUSED[self.kind]}; kinds: {', '.join(KNOBS)}")
        if self.kind not in KNOBS:
            raise ValueError(f"kind {self.kind!r} is not a TextWorld game kind here: {', '.join(KNOBS)}")
        others = sorted((self.model_fields_set & {k for ks in KNOBS.values() for k in ks}) - set(KNOBS[self.kind]))
        if others:
            raise ValueError(f"{others[0]}: {self.kind} games have no such knob ({', '.join(KNOBS[self.kind])})")
        for knob, values in (self.levels or {}).items():
            if len(self.levels or {}) != 1 or knob not in KNOBS[self.kind] or not values:
                raise ValueError(f"levels: one knob of {self.kind} games ({', '.join(KNOBS[self.kind])}) with its "
                                 f"values, easiest first; got {knob!r}")
            for value in (min(values), max(values)):  # each level a game the knob's bounds allow
                GameSpec(**{**self._knobs(), knob: value})
        if self.answer == "number" and self.commands == "none":
            raise ValueError("answer: number picks from the commands listed: commands must be all or actions")
        longest = max(s.quest() for s in self.specs_at_levels())
        if longest > self.max_steps:
            raise ValueError(f"quest of {longest} commands is longer than max_steps={self.max_steps} allows: "
                             "no game could be won")
        return self

    def _knobs(self) -> dict[str, Any]:
        return {"kind": self.kind, **{k: getattr(self, k) for k in KNOBS[self.kind]}}

    def specs_at_levels(self, seed: int = 0) -> list[GameSpec]:
        """One game spec per level (the options' own knobs without ``levels``), with ``seed``."""
        if not self.levels:
            return [GameSpec(**self._knobs(), seed=seed)]
        ((knob, values),) = self.levels.items()
        return [GameSpec(**{**self._knobs(), knob: v}, seed=seed) for v in values]

    def level_names(self) -> list[str]:
        return [f"{k}={v}" for k, vs in (self.levels or {}).items() for v in vs]


def _seeds(options: TextworldOptions, split: str, count: int) -> list[int]:
    """``count`` game seeds of ``split``: draws from ``seed`` and the split's name, apart between splits."""
    rng = random.Random(f"{options.seed}:{split}")
    return rng.sample(range(1, 2**31 - 1), count)


def games(options: TextworldOptions, split: str) -> list[Sample]:
    """``split``'s games, each a sample whose prompt is the game's opening (module docstring)."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    size = options.train_size if split == "train" else options.test_size
    seeds = _seeds(options, split, size)
    by_seed = [options.specs_at_levels(seed) for seed in seeds]
    specs = [(level, row[level]) for level in range(len(by_seed[0])) for row in by_seed]  # level by level
    paths = ensure([s for _, s in specs])
    held = set() if split == "test" else {  # a training game is never a held-out one (module docstring)
        digest(p) for p in ensure([s for seed in _seeds(options, "test", options.test_size)
                                   for s in options.specs_at_levels(seed)])}
    kept = [(lv, s, p) for (lv, s), p in zip(specs, paths) if not held or digest(p) not in held]
    session = session_options(options)
    return [Sample(prompt=[{"role": "user", "content": Play(str(path), session).opening()}], ground_truth="won",
                   extra_info={"game": spec.model_dump(), "quest": spec.quest()},
                   level=level if options.levels else None, data_source=f"textworld/{options.kind}", index=i)
            for i, (level, spec, path) in enumerate(kept)]


def session_options(options: TextworldOptions) -> TextworldSessionOptions:
    return TextworldSessionOptions(commands=options.commands, answer=options.answer, reward=options.reward,
                                   order=options.order)


def worked_example(options: TextworldOptions) -> list[dict[str, Any]]:
    """A small game (the options' easiest level, a seed no split draws) won by its walkthrough, turn by
    turn as the model plays one (the game's replies as user turns): for a small model to imitate the
    answers' form. Under ``answer: tool`` none (the chat template shows the tool)."""
    if options.answer == "tool":
        return []
    (path,) = ensure(options.specs_at_levels(EXAMPLE_SEED)[:1])
    play = Play(str(path), session_options(options))
    messages = [{"role": "user", "content": play.opening()}]
    for command in play.state["policy_commands"]:
        listed = play.listed()
        answer = str(listed.index(command) + 1) if options.answer == "number" else command
        reply, _, _ = play.act(answer)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": reply}]
    return messages[:-1]  # the last reply ("You won!") is not a question


def configure(options: TextworldOptions) -> dict[str, Any]:
    return {"max_turns": options.max_steps, "session_options": session_options(options).model_dump(),
            "system_prompt": SYSTEM_PROMPTS[options.answer], "levels": options.level_names(),
            "prompt_prefix": worked_example(options) if options.example else [],
            "parser": "hermes" if options.answer == "tool" else "textworld_command"}


TEXTWORLD = Environment(
    name="textworld",
    description="TextWorld's generated text games (custom quests, Treasure Hunter levels) played command by command "
                "on its own engine: score delta as step reward, 1 for a win; held-out games never trained on; "
                "a knob's values as difficulty levels.",
    splits={"train": games, "test": games},
    system_prompt=SYSTEM_PROMPTS["number"],
    session="textworld",
    parser="textworld_command",
    max_turns=20,
    metric="textworld",
    options=TextworldOptions,
    configure=configure,
    sized=False,  # counting the splits generates their games: 48 take half a minute at the defaults
)
