"""The ``textarena`` session kind: one TextArena game per trajectory, each seat either the model,
as the role ``player_<seat>``, or a fixed player (``toolrl_textarena.players``).

The sample's ground truth names the game, its seed and each seat's player. Before each model turn
the session gives the turn to the role of the seat to move (``role``); the model's answer is that
seat's move, sent as it is to the game's ``step`` (TextArena's wrappers read the move in it, and its
rules decide an invalid one: a retry message, then the loss); the fixed seats move inside the
session, and the next user turn is what the game told the model's seat since it last moved. The game
over ends the trajectory. Its rewards are TextArena's: the score is the first model seat's reward
(each seat's under ``textarena.player_<seat>``), and each model seat's role gets its own
(``role_rewards``), which that role's baseline compares. A trajectory that ends before the game
(a turn cut at ``max_new_tokens``, ``max_turns``, ``max_response_tokens``) leaves the seat to move
without a move: an invalid move, repeated until TextArena's rule ends the game (two in TicTacToe:
that seat loses), so stopping early never pays better than losing.

Every seat of the model reads one conversation: a seat's turns show what TextArena told that seat,
less the messages the conversation showed since that seat's last turn (the other seat's view of the
same moves), and the other model seats read them too. Games of public information (TicTacToe) lose
nothing; hidden cards (Kuhn Poker) are for a model against a fixed player.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from toolrl.schemas import Sample
from toolrl.sessions import EnvironmentSession, Reset
from toolrl.trajectory import Trajectory

from toolrl_textarena.game import PLAYERS, Game, check_game
from toolrl_textarena.players import fixed_move

Seat = Literal["model", "random", "first"]
ROLES = tuple(f"player_{seat}" for seat in range(PLAYERS))
# Where a message of TextArena's text observation starts: a line opening with its sender ("[GAME] ", "[Player 0] ").
_MESSAGE = re.compile(r"\n(?=\[[^\]\n]+\] )")


class Task(BaseModel):
    """A sample's ground truth: the game, its seed and who plays each seat."""

    model_config = ConfigDict(extra="forbid")
    game: str
    seed: int
    seats: list[Seat] = Field(min_length=PLAYERS, max_length=PLAYERS)


class GameSession(EnvironmentSession):
    roles = ROLES
    timeout = 30.0

    async def reset(self, sample: Sample) -> Reset:
        self.task = Task.model_validate(sample.ground_truth)
        check_game(self.task.game)
        if "model" not in self.task.seats:
            raise ValueError("no seat is the model's")
        self.game = Game(self.task.game, self.task.seed)
        self.rng = random.Random(f"{self.task.seed}:{self.context.trajectory_id}")
        self.seat = 0
        self.shown: dict[int, list[str]] = {seat: [] for seat in range(PLAYERS)}  # since each seat's last turn
        news = self._until_model()
        if news is None:
            raise ValueError(f"{self.task.game} ended before the model's first move")
        return Reset(messages=[{"role": "user", "content": news}])

    def _until_model(self) -> str | None:
        """Fixed seats move until a model seat is to move: what is new to it, or None when the game ends."""
        while True:
            seat, news = self.game.news()
            if self.task.seats[seat] == "model":
                self.seat = seat
                return self._unshown(seat, news)
            if self.game.move(fixed_move(self.task.seats[seat], news, self.rng)):
                return None

    def _unshown(self, seat: int, news: str) -> str:
        """``news`` less the messages the conversation showed since ``seat``'s last turn; what is left
        is shown to every other model seat."""
        seen, kept = self.shown[seat], []
        for message in _MESSAGE.split(news):
            if message in seen:
                seen.remove(message)
            else:
                kept.append(message)
        self.shown[seat] = []
        for other, player in enumerate(self.task.seats):
            if other != seat and player == "model":
                self.shown[other].extend(kept)
        return "\n".join(kept)

    async def role(self) -> str:
        return ROLES[self.seat]

    async def respond(self, message: str) -> str | None:
        if self.game.move(message):
            return None
        return self._until_model()

    def _rewards(self) -> dict[int, float]:
        if self.game.rewards is None:
            self.game.forfeit("the player's turn ended without a move (the trajectory's limit)")
        self.game.finish()
        rewards = self.game.rewards or {}
        return {seat: rewards.get(seat, 0.0) for seat in range(PLAYERS)}

    async def score(self, trajectory: Trajectory) -> Mapping[str, float]:
        rewards = self._rewards()
        first = self.task.seats.index("model")
        return {"reward": rewards[first], **{ROLES[s]: r for s, r in rewards.items()}}

    async def role_rewards(self) -> Mapping[str, float]:
        rewards = self._rewards()
        return {ROLES[s]: r for s, r in rewards.items() if self.task.seats[s] == "model"}

    async def close(self) -> None:
        if getattr(self, "game", None) is not None:
            self.game.finish()
