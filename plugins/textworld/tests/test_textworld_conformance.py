"""The ``textworld`` session through the environment-session conformance kit: a game won by its
walkthrough (typed, and by the numbers of the listed commands), one wandered without winning, and a
Treasure Hunter game lost by taking a wrong object. The game lives in the session's process: there is
no backend to take away."""

from __future__ import annotations

from toolrl.schemas import Sample, ToolCall
from toolrl.testing import SessionConformance, SessionPlay
from toolrl_textworld.games import GameSpec, ensure
from toolrl_textworld.session import Play, TextworldSessionOptions

GAME = GameSpec(kind="custom", rooms=2, objects=1, quest_length=2, seed=7)
HUNT = GameSpec(kind="treasure_hunter", level=1, seed=3)
ensure([GAME, HUNT])


def sample(spec: GameSpec) -> Sample:
    return Sample(prompt="Play.", ground_truth="won", extra_info={"game": spec.model_dump()})


def act(command: str) -> ToolCall:
    return ToolCall(name="act", arguments={"command": command})


def walkthrough(spec: GameSpec) -> list[str]:
    return list(Play(str(spec.path()), TextworldSessionOptions()).state["policy_commands"])


def numbers(spec: GameSpec) -> list[str]:
    """The walkthrough as the numbers of the commands listed at each step."""
    play, out = Play(str(spec.path()), TextworldSessionOptions()), []
    for command in walkthrough(spec):
        out.append(str(play.state["admissible_commands"].index(command) + 1))
        play.act(out[-1])
    return out


def wrong_object(spec: GameSpec) -> str:
    play = Play(str(spec.path()), TextworldSessionOptions(answer="text"))
    goal = walkthrough(spec)[-1]
    return next(c for c in play.state["admissible_commands"] if c.startswith("take ") and c != goal)


class TestTextworldTyped(SessionConformance):
    session_name = "textworld"
    session_options = {"answer": "text"}
    plays = [
        SessionPlay(sample(GAME), [act(c) for c in walkthrough(GAME)], terms={"textworld": 1.0}),
        SessionPlay(sample(GAME), [act("look"), act("inventory"), act("dance")], terms={"textworld": 0.0}),
        SessionPlay(sample(HUNT), [act(wrong_object(HUNT))], terms={"textworld": 0.0}),
    ]
    no_backend = "the game is TextWorld's Python engine in the session's own object"


class TestTextworldNumbered(SessionConformance):
    session_name = "textworld"
    plays = [SessionPlay(sample(GAME), [act(n) for n in numbers(GAME)], terms={"textworld": 1.0}),
             SessionPlay(sample(GAME), [act("0"), act("99"), act("look")], terms={"textworld": 0.0})]
    no_backend = "the game is TextWorld's Python engine in the session's own object"
