"""The textarena session against TextArena itself: a game replayed from recorded moves ends in the
library's own state with its own rewards (the library's ``step`` on the same moves beside it), each
seat's pieces carry its role, and a fixed player moves as the game lists."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import textarena as ta
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.schemas import Sample
from toolrl.sessions import SessionContext, SessionKind, SharedParts
from toolrl.testing import ScriptedEngine
from toolrl_textarena.players import fixed_move, listed_moves
from toolrl_textarena.session import ROLES, GameSession

# Recorded games of TicTacToe-v0: Player 0 wins down the middle column; Player 1 plays an occupied cell
# twice (TextArena lets one invalid move be retried, the second loses); a draw.
GAMES = {
    "win": ["[4]", "[0]", "[1]", "[8]", "[7]"],
    "invalid": ["I take the centre [4]", "[4]", "[4] again"],
    "draw": ["[4]", "[0]", "[8]", "[2]", "[1]", "[7]", "[6]", "[3]", "[5]"],
}


def library_game(game: str, seed: int, moves: list[str]):
    """TextArena on its own: the moves through its step, then its close."""
    env = ta.make(env_id=game)
    env.reset(num_players=2, seed=seed)
    for move in moves:
        env.get_observation()
        if env.step(move)[0]:
            break
    return env, env.close()


def sample(seats=("model", "model"), game="TicTacToe-v0", seed=5):
    return Sample(prompt=[{"role": "user", "content": "A game begins."}],
                  ground_truth={"game": game, "seed": seed, "seats": list(seats)})


def context(tokenizer, moves, roles=ROLES):
    kind = SessionKind("textarena", GameSession, GameSession.Options(), ".")
    return RolloutContext(engine=ScriptedEngine(tokenizer, moves),
                          renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                          config=RolloutConfig(max_response_tokens=4096),
                          routes={None: Route({}, 12, HermesParser(), [], RewardConfig(), kind)}, roles=roles)


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


async def played(moves, seats=("model", "model"), trajectory_id="t0"):
    """The session driven by hand: its reset, then each move as the model's answer."""
    session = GameSession(GameSession.Options(), SessionContext(
        where="session.name", options_where="session.options", name="textarena", trajectory_id=trajectory_id,
        base_dir=Path("."), shared=SharedParts()))
    await session.reset(sample(seats))
    for move in moves:
        if await session.respond(move) is None:
            break
    return session


@pytest.mark.parametrize("name", GAMES)
def test_a_replayed_game_ends_in_textarenas_own_state_with_its_own_rewards(name):
    session = asyncio.run(played(GAMES[name]))
    env, (rewards, info) = library_game("TicTacToe-v0", 5, GAMES[name])
    assert session.game.env.state.game_state == env.state.game_state  # the board
    assert session.game.rewards == {int(k): float(v) for k, v in rewards.items()} and session.game.info == info
    expected = {"win": {0: 1.0, 1: -1.0}, "invalid": {0: 1.0, 1: -1.0}, "draw": {0: 0.0, 1: 0.0}}[name]
    assert session.game.rewards == expected
    if name == "invalid":
        assert info[1]["invalid_move"] is True


@pytest.mark.parametrize("name", ["win", "invalid"])
def test_each_seats_pieces_carry_its_role_and_its_reward(tokenizer, name):
    moves = GAMES[name]
    pieces = asyncio.run(run_trajectory_pieces(context(tokenizer, moves), sample(), 0, "t0", 0))
    env, (rewards, _) = library_game("TicTacToe-v0", 5, moves)
    seats = [0, 1, 0, 1, 0] if name == "win" else [0, 1, 1]  # an invalid move is retried by the same seat
    merged = [p.role for p in pieces]
    assert merged == [ROLES[s] for i, s in enumerate(seats) if i == 0 or s != seats[i - 1]]
    assert pieces[-1].termination == "answered" and sum(p.turns for p in pieces) == len(moves)
    for piece in pieces:
        assert piece.role_rewards == {"player_0": rewards[0], "player_1": rewards[1]}
        assert piece.reward == rewards[0]
    assert pieces[-1].reward_parts["textarena.player_1"] == rewards[1]
    # Each turn's user message is what the game told the seat to move: its board after the other's move.
    text = tokenizer.decode(pieces[-1].prompt_ids)
    assert f"[Player 0] {moves[0]}" in text and "You are Player 1" in text


def test_a_fixed_player_moves_as_the_game_lists_and_the_model_holds_one_seat(tokenizer):
    # The model (Player 1) against the first-listed-move player: it plays [0], [1], [2] and wins the top row.
    moves = ["[4]", "[5]", "[3]"]
    pieces = asyncio.run(run_trajectory_pieces(context(tokenizer, moves), sample(("first", "model")), 0, "t0", 0))
    env, (rewards, _) = library_game("TicTacToe-v0", 5, ["[0]", "[4]", "[1]", "[5]", "[2]"])
    assert rewards == {0: 1, 1: -1}
    assert [p.role for p in pieces] == ["player_1"] and pieces[0].reward == -1.0
    assert pieces[0].role_rewards == {"player_1": -1.0}
    assert listed_moves("x\nAvailable Moves: '[0]', '[5]'") == ["[0]", "[5]"]
    rng = random.Random(0)
    assert {fixed_move("random", "Your available actions are: '[check]', '[bet]'", rng) for _ in range(40)} == \
        {"[check]", "[bet]"}
