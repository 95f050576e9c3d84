"""Each model turn's start and the key of the state it starts from, recorded on the trajectory
(``Trajectory.turn_starts``, ``turn_states``) for turn-level credit (the ``gigpo`` estimator groups
the turns of a group's trajectories that start from one state).

The key is the session's ``state_key`` (``env:``) when it gives one, else the hashed tokens of the
observation the turn answers (``obs:``; a piece's first turn: its prompt). Only the latest observation,
as in GiGPO: keyed by the whole history, almost every step group past the first turn would be a
singleton; keyed by the observation, trajectories that reach the same tool result by different paths
are compared.
"""

from __future__ import annotations

import hashlib
from array import array

from toolrl.sessions import SessionRun
from toolrl.trajectory import Trajectory, model_tokens_end

__all__ = ["record_turn"]


def observation_key(traj: Trajectory) -> str:
    """The key of the observation the next turn of ``traj`` starts from (module docstring)."""
    end = model_tokens_end(traj.response_mask)
    tokens = traj.response_ids[end:] if end else traj.prompt_ids + traj.response_ids
    digest = hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16)
    return "obs:" + digest.hexdigest()


async def record_turn(traj: Trajectory, session: SessionRun | None) -> None:
    """Record that a model turn starts at the end of ``traj``'s response, and its state's key
    (``session``: None when no estimator reads the session's keys; the observation's stands in)."""
    key = None if session is None else await session.state_key()
    traj.turn_states.append(observation_key(traj) if key is None else "env:" + key)
    traj.turn_starts.append(len(traj.response_ids))
