"""The ``textarena`` environment: games of one TextArena two-player game, played through the
``textarena`` session (toolrl_textarena.session).

The training split is self-play (``train_opponent: self``: the model in both seats, one role each)
or a fixed player; the test split is always against a fixed player (``test_opponent``), the model's
seat alternating between samples, so a held-out evaluation scores the model against a player it
need never have trained against. Each sample's game seed is its own: the test split's seeds follow
the training split's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from toolrl.environments import Environment
from toolrl.schemas import Sample

from toolrl_textarena.game import PLAYERS, Game, check_game
from toolrl_textarena.players import listed_moves

SYSTEM_PROMPT = ("You are playing a game. The user's messages are what the game tells you; answer each "
                 "with your move in square brackets, as the game's rules show (e.g. [4]).")


class TextArenaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    game: str = Field("TicTacToe-v0", description="a TextArena environment id for two players "
                      "(games needing nltk data aside)")
    train_opponent: Literal["self", "random", "first"] = Field(
        "self", description="self: the model in both seats (self-play; a frozen adapter as one role: a frozen "
        "opponent); random/first: a fixed player")
    test_opponent: Literal["random", "first"] = "random"
    train_size: int = Field(512, gt=0)
    test_size: int = Field(64, gt=0)
    seed: int = Field(0, ge=0)
    max_turns: int = Field(12, gt=0, description="model turns per game (invalid moves retried included)")

    @field_validator("game")
    @classmethod
    def _known(cls, game: str) -> str:
        return check_game(game)


def games(options: TextArenaOptions, split: str) -> list[Sample]:
    """``split``'s games: seeds ``seed + i`` for training, then the test split's after them."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    train = split == "train"
    size, first, opponent = ((options.train_size, options.seed, options.train_opponent) if train else
                             (options.test_size, options.seed + options.train_size, options.test_opponent))
    out = []
    for i in range(size):
        if opponent == "self":
            seats = ["model"] * PLAYERS
        else:  # the model's seat alternates
            seats = [opponent] * PLAYERS
            seats[i % PLAYERS] = "model"
        who = "yourself" if opponent == "self" else f"a {opponent} player (you are Player {i % PLAYERS})"
        out.append(Sample(prompt=[{"role": "user", "content": f"A game of {options.game} against {who} begins."}],
                          ground_truth={"game": options.game, "seed": first + i, "seats": seats},
                          data_source=f"textarena/{options.game}", index=i))
    return out


def example(game: str) -> list[dict[str, str]]:
    """A worked first turn, for small models to imitate: the game's opening as Player 0 sees it (seed
    0), answered with the middle one of the moves it lists."""
    opening = Game(game, 0)
    _, news = opening.news()
    opening.finish()
    moves = listed_moves(news)
    return [{"role": "user", "content": news}, {"role": "assistant", "content": moves[len(moves) // 2]}] if moves else []


def configure(options: TextArenaOptions) -> dict[str, Any]:
    return {"max_turns": options.max_turns, "prompt_prefix": example(options.game)}


TEXTARENA = Environment(
    name="textarena",
    description="A TextArena two-player game (TicTacToe, Kuhn Poker, ...): self-play with a role per seat, a frozen "
                "adapter or a fixed player as the opponent; the game's own rules and rewards.",
    splits={"train": games, "test": games},
    system_prompt=SYSTEM_PROMPT,
    session="textarena",
    parser="hermes",
    max_turns=12,
    metric="textarena",
    options=TextArenaOptions,
    configure=configure,
)
