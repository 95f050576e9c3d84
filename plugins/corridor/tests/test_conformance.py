"""The ``corridor`` session through the environment-session conformance kit: a straight walk out, a
walk with a detour that still gets out, and one that never does, each scoring what the session's
rules give (1 only at the exit), within the deadlines and side by side. The episode lives in the
session object: there is no backend to take away."""

from __future__ import annotations

from toolrl.schemas import Sample, ToolCall
from toolrl.testing import SessionConformance, SessionPlay

ROOMS = ["hall", "study", "attic"]
SAMPLE = Sample(prompt="Walk out of the attic.", ground_truth="exit", extra_info={"rooms": ROOMS})
DOORS = Sample(prompt="Walk out of the attic.", ground_truth="exit",
               extra_info={"rooms": ROOMS, "doors": ["west", "east", "west"]})


def move(direction: str) -> ToolCall:
    return ToolCall(name="move", arguments={"direction": direction})


class TestCorridor(SessionConformance):
    session_name = "corridor"
    plays = [
        SessionPlay(SAMPLE, [move("east")] * 3, terms={"corridor": 1.0}),
        # a step back, a wall, an unknown door: each costs a turn, none ends the walk
        SessionPlay(SAMPLE, [move("east"), move("west"), move("west"), move("up"), move("east"), move("east"),
                             move("east")], terms={"corridor": 1.0}),
        SessionPlay(SAMPLE, [move("east"), move("east"), move("west"), move("east")], terms={"corridor": 0.0}),
        # the doors on differ by room: east everywhere walks into a wall, west-east-west gets out
        SessionPlay(DOORS, [move("east"), move("west"), move("east"), move("west")], terms={"corridor": 1.0}),
        SessionPlay(DOORS, [move("east")] * 4, terms={"corridor": 0.0}),
    ]
    no_backend = "the episode is the session object's state, in the rollout worker's process"
