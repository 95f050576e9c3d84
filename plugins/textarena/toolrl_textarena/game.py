"""One TextArena game as its players see it: each seat's observations as they grow, moves sent to
the game's own ``step`` (its wrappers, rules and invalid-move handling untouched) and its own rewards
at the end."""

from __future__ import annotations

from typing import Any

import textarena as ta
from textarena.envs.registration import ENV_REGISTRY

PLAYERS = 2  # the seats a session's roles name (player_0, player_1)


def check_game(game: str) -> str:
    """``game`` is a TextArena environment id (one line with the closest ids otherwise)."""
    if game not in ENV_REGISTRY:
        import difflib

        close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=3)
        raise ValueError(f"TextArena has no game {game!r}" + (f" (did you mean {', '.join(map(repr, close))}?)"
                                                                 if close else ""))
    return game


class Game:
    """``ta.make(game)`` reset for two players with ``seed``. :meth:`news` gives a seat what the game
    told it since that seat last looked (the observation wrappers give the whole history as one text:
    the part after what it saw; a text that does not extend it, such as a board redrawn, whole)."""

    def __init__(self, game: str, seed: int) -> None:
        self.env = ta.make(env_id=game)
        self.env.reset(num_players=PLAYERS, seed=seed)
        self.seen: dict[int, str] = {}
        self.rewards: dict[int, float] | None = None
        self.info: dict[Any, Any] = {}

    def news(self) -> tuple[int, str]:
        """The seat to move and what is new to it."""
        seat, observation = self.env.get_observation()
        text = observation if isinstance(observation, str) else "\n".join(f"[{s}] {m}" for s, m, *_ in observation)
        before = self.seen.get(seat, "")
        self.seen[seat] = text
        return seat, (text[len(before):] if before and text.startswith(before) else text).strip()

    def move(self, action: str) -> bool:
        """The seat to move plays ``action``; whether the game is over (then its rewards are kept)."""
        done, _ = self.env.step(action)
        if done:
            self.finish()
        return done

    def forfeit(self, reason: str) -> None:
        """The seat to move did not move (its turn cut short): an invalid move, as many times as the
        game's error allowance takes to end it, so TextArena's own rule decides the outcome."""
        state = self.env.state
        for _ in range(1 + int(getattr(state, "error_allowance", 0) or 0)):
            if state.done:
                break
            state.set_invalid_move(reason=reason)

    def finish(self) -> None:
        """Close the game once: its rewards per seat and its info."""
        if self.rewards is None and not self.info:
            rewards, self.info = self.env.close()
            self.rewards = None if rewards is None else {int(k): float(v) for k, v in rewards.items()}
