"""Fixed players: a seat TextArena plays against the model without a model. Each reads the moves the
game lists in its last observation (``Available Moves: '[0]', '[4]'`` in TicTacToe, ``'[check]',
'[bet]'`` in Kuhn Poker) and picks one: ``random`` uniformly (seeded per trajectory), ``first`` the
first listed."""

from __future__ import annotations

import random
import re
from typing import Literal

FixedPlayer = Literal["random", "first"]
_LISTED = re.compile(r"'(\[[^\]']+\])'")


def listed_moves(observation: str) -> list[str]:
    """The moves the last line that lists any (``'[x]'``) offers."""
    for line in reversed(observation.splitlines()):
        moves = _LISTED.findall(line)
        if moves:
            return moves
    return []


def fixed_move(player: FixedPlayer, observation: str, rng: random.Random) -> str:
    moves = listed_moves(observation)
    if not moves:
        raise ValueError(f"the {player} player found no listed moves ('[move]') in its observation: "
                         "this game does not list its moves, so it needs a model in every seat")
    return moves[0] if player == "first" else rng.choice(moves)
