"""The rollouts: the async multi-turn agent loop (``loop``) and what it runs with, one module per idea
(each listed in docs/architecture.md).
"""

from toolrl.rollout.episode import prompt_of
from toolrl.rollout.loop import run_group, run_rollouts, run_trajectory, run_trajectory_pieces
from toolrl.rollout.rollout_context import RolloutContext, Route

__all__ = ["RolloutContext", "Route", "prompt_of", "run_group", "run_rollouts", "run_trajectory",
           "run_trajectory_pieces"]
