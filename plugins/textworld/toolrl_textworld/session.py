"""The ``textworld`` session: one game per trajectory, played on TextWorld's pure-Python engine
(``textworld.envs.tw.TextWorldEnv``: the game's own rules, quests, score and admissible commands).

Each model turn is one ``act`` call (a tool call, or the ``textworld_command`` parser's reading of the
turn's text): the command, or under ``answer: number`` the number of one of the listed commands. The
reply is what it did, then the view (toolrl_textworld.narrator) and, with ``commands``, the admissible
commands. Its step reward is the game's score delta over its maximum (``reward: progress``: TextWorld's
intermediate reward, +1 a command that shortens the winning policy, -1 one that lengthens it, over the
walkthrough's length); the episode ends at a win or a loss, and the session's score is 1 for a win.
The state key is the view: trajectories of a group standing in the same state share it.

A game is loaded once per process (a reset copies it, reset); an engine that raises is that
trajectory's infrastructure error.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl import InfrastructureError
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import EnvironmentSession, Reset, StepResult
from toolrl.trajectory import Trajectory

from toolrl_textworld import narrator
from toolrl_textworld.games import GameSpec, ensure
from toolrl_textworld.parser import ARGUMENT, TOOL
from toolrl_textworld.upstream import load

ACT = {"type": "function", "function": {
    "name": TOOL, "description": "Type one command in the text game (e.g. 'go east', 'take key', 'open box').",
    "parameters": {"type": "object", "properties": {ARGUMENT: {"type": "string"}}, "required": [ARGUMENT]}}}


class TextworldSessionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    commands: Literal["all", "actions", "none"] = Field(
        "all", description="the admissible commands listed after each view: all, only those that can change the "
        "state (look, inventory and examine never do), or none")
    answer: Literal["tool", "text", "number"] = Field("number", description="how a command comes: a tool call, "
                                                      "a line of text, or the number of a listed command")
    reward: Literal["score", "progress"] = Field("score", description="the step reward: the score's delta, or "
                                                 "TextWorld's intermediate reward (progress along the winning policy)")
    order: Literal["textworld", "shuffled"] = Field(
        "textworld", description="the menu's order: TextWorld's (alphabetical), or shuffled by the state (the same "
        "state, the same menu), so that a command's place says nothing about it")


@functools.lru_cache(maxsize=256)
def _started(path: str) -> Any:
    """The game at ``path`` loaded and reset, once per process: sessions play copies of it."""
    tw = load()
    env = tw.TextWorldEnv(tw.EnvInfos(admissible_commands=True, intermediate_reward=True, policy_commands=True))
    env.load(path)
    env.reset()
    return env


NO_OPS = ("look", "inventory", "examine ")  # TextWorld commands that only describe: never a change of state


def menu(commands: list[str], numbered: bool) -> str:
    if numbered:
        return "Commands:\n" + "\n".join(f"{i}. {c}" for i, c in enumerate(commands, 1))
    return "Commands: " + "; ".join(commands)


class Play:
    """One game being played: TextWorld's engine and what the player reads of it (module docstring)."""

    def __init__(self, path: str, options: TextworldSessionOptions) -> None:
        self.env = _started(path).copy()
        self.options = options
        self.walkthrough = len(self.env.state["policy_commands"]) or 1
        self.max_score = self.env.state["max_score"] or 1
        self.points = 0
        self.names = {key: info.name for key, info in self.state["game"].infos.items() if info.name}

    @property
    def state(self) -> Any:
        return self.env.state

    def world(self) -> narrator.World:
        return narrator.World.of(narrator.facts_of(self.state["_facts"], self.names))

    def view(self) -> str:
        return narrator.view(self.world())

    def shown(self, text: str) -> str:
        """``text`` then, with ``commands`` and the game not over, the commands listed."""
        if self.options.commands == "none" or self.state["won"] or self.state["lost"]:
            return text
        return f"{text}\n\n{menu(self.listed(), self.options.answer == 'number')}"

    def listed(self) -> list[str]:
        """The commands the menu lists (``commands``) in its ``order``: the numbers refer to them. TextWorld's
        order is alphabetical, so a place tells the verb (``1`` is often close or drop): a small model answers
        by place and RL sharpens that habit; ``shuffled`` leaves reading the only way."""
        commands = self.state["admissible_commands"]
        if self.options.commands == "actions":
            commands = [c for c in commands if not c.startswith(NO_OPS)]
        if self.options.order == "shuffled":
            view = self.view()
            commands = sorted(commands, key=lambda c: hashlib.blake2b(f"{view}\n{c}".encode(), digest_size=8).digest())
        return commands

    def opening(self) -> str:
        return self.shown(f"{self.state['objective']}\n\n{self.view()}")

    def command(self, said: str) -> str | None:
        """The command ``said`` names: itself, or under ``answer: number`` the listed command of that number."""
        commands = self.listed()
        if self.options.answer != "number":
            return " ".join(said.lower().split())
        found = re.fullmatch(r"\s*(\d+)[.)]?\s*.*", said)
        if found and 1 <= int(found[1]) <= len(commands):
            return commands[int(found[1]) - 1]
        return next((c for c in commands if c == said.strip().lower()), None)  # the command itself

    def act(self, said: str) -> tuple[str, float | None, bool]:
        """The reply to what the model said, the step's reward (None: nothing happened) and whether the game is over."""
        command = self.command(said)
        if command is None:
            count = len(self.listed())
            return self.shown(f"There is no command {said.strip()!r}: answer with the number of one of the "
                              f"{count} commands."), None, False
        if command not in self.state["admissible_commands"]:
            return self.shown(f"You cannot {command!r} here.\n\n{self.view()}"), None, False
        try:
            state, score, done = self.env.step(command)
        except Exception as exc:  # the engine's fault, never the model's
            raise InfrastructureError(f"TextWorld's engine failed on {command!r}: {type(exc).__name__}: "
                                             f"{exc}") from exc
        reward = ((score - self.points) / self.max_score if self.options.reward == "score"
                  else state["intermediate_reward"] / self.walkthrough)
        self.points = score
        return self.shown(self._reply(command)), reward, bool(done)

    def _reply(self, command: str) -> str:
        if self.state["won"]:
            return f"You {command}.\n\n*** You won! ***"
        if self.state["lost"]:
            return f"You {command}.\n\n*** You lost. ***"
        if command == "inventory":
            return narrator.inventory(self.world())
        if command == "look":
            return self.view()
        if command.startswith("examine "):
            return f"{_described(self.state, command[8:])}\n\n{self.view()}"
        return f"You {command}.\n\n{self.view()}"


class TextworldSession(EnvironmentSession):
    Options = TextworldSessionOptions
    timeout = 30.0

    async def reset(self, sample: Sample) -> Reset:
        spec = GameSpec(**sample.extra_info["game"])
        (path,) = ensure([spec])  # cached: generated only on a machine that never loaded the split
        self.play = Play(str(path), self.options)
        return Reset(tools=[ACT], replace_tools=True, render_tools=self.options.answer == "tool")

    def step(self, call: ToolCall) -> StepResult:
        reply, reward, done = self.play.act(str(call.arguments.get(ARGUMENT, "")))
        return StepResult(response=reply, reward=reward, done=done, metrics={"textworld.points": self.play.points})

    async def state_key(self) -> str:
        return self.play.view()

    async def clone(self) -> TextworldSession:
        twin = type(self)(self.options, self.context)
        twin.play = copy.copy(self.play)
        twin.play.env = self.play.env.copy()
        return twin

    async def score(self, trajectory: Trajectory) -> float:
        return 1.0 if self.play.state["won"] else 0.0


def _described(state: Any, name: str) -> str:
    """The thing's description as TextWorld wrote it, up to its first Inform 7 condition (``[if open]…``),
    which only the compiled game evaluates."""
    game = state["game"]
    desc = next((info.desc for info in game.infos.values() if info.name == name and info.desc), "")
    return desc.split("[", 1)[0].strip() or f"You see nothing special about the {name}."
