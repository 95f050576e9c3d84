"""The ``corridor`` session: one trajectory's walk through :mod:`toolrl_corridor.environment`.

State per trajectory: the room it stands in (0 … rooms - 1) and whether it got out. The room's door
on (``extra_info.doors``, by room; ``east`` everywhere without it) goes one room on (out of the last:
the exit, which ends the episode), the other door one back (from the first room: a wall, it stays);
any other direction is an error the model reads, and it stays.
No step earns a reward: the score is 1 when the walk got out, else 0, so the turns' credit is left
to the estimator. The state key is the room alone: the same in every trajectory of a group that
stands there, however it got there (``key_turns``: and after as many moves).
"""

from __future__ import annotations

import copy

from pydantic import BaseModel, ConfigDict, Field
from toolrl.schemas import Sample, ToolCall, ToolResponse
from toolrl.sessions import EnvironmentSession, Reset, StepResult
from toolrl.trajectory import Trajectory

MOVE = {"type": "function", "function": {
    "name": "move", "description": "Move one room east (toward the exit) or west.",
    "parameters": {"type": "object", "properties": {"direction": {"type": "string", "enum": ["east", "west"]}},
                   "required": ["direction"]}}}


class CorridorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key_turns: bool = Field(False, description="the state key also counts the moves made: a room with fewer "
                            "turns left is another state (the walk has a turn budget)")


class CorridorSession(EnvironmentSession):
    Options = CorridorOptions
    timeout = 5.0

    async def reset(self, sample: Sample) -> Reset:
        rooms = sample.extra_info.get("rooms")
        if not (isinstance(rooms, list) and len(rooms) >= 2 and all(isinstance(r, str) for r in rooms)):
            raise ValueError("a corridor sample needs extra_info.rooms: a list of at least two room names")
        doors = sample.extra_info.get("doors") or ["east"] * len(rooms)
        if not (isinstance(doors, list) and len(doors) == len(rooms) and set(doors) <= {"east", "west"}):
            raise ValueError("extra_info.doors: one door on (east or west) per room")
        self.rooms = rooms
        self.doors = doors
        self.room = 0
        self.moves = 0
        self.exited = False
        return Reset(tools=[MOVE])

    def step(self, call: ToolCall) -> StepResult:
        direction = str(call.arguments.get("direction", "")).strip().lower()
        self.moves += 1
        on = self.doors[self.room]
        if direction == on and self.room + 1 == len(self.rooms):
            self.exited = True
            return StepResult(response="You walk out through the exit.", done=True)
        if direction == on:
            self.room += 1
        elif direction in ("east", "west") and self.room > 0:
            self.room -= 1
        elif direction in ("east", "west"):
            return StepResult(response=f"A wall: you stay in the {self.rooms[0]}.")
        else:
            return StepResult(response=ToolResponse.error(f"no door {direction!r}: move east or west"))
        return StepResult(response=f"You are in the {self.rooms[self.room]}, room {self.room + 1} of {len(self.rooms)}.")

    async def state_key(self) -> str:
        return f"room {self.room}" + (f" after {self.moves} moves" if self.options.key_turns else "")

    async def clone(self) -> CorridorSession:
        return copy.copy(self)  # the room names and doors are shared and never changed

    async def score(self, trajectory: Trajectory) -> float:
        return 1.0 if self.exited else 0.0
