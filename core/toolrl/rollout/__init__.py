"""The rollouts: the async multi-turn agent loop and what it runs with, one module per idea.

- ``loop``: the turn loop, top to bottom: every sample × n concurrently, each trajectory's turns
  (generate, parse, run the calls, show the results) until one ends it, then its score.
- ``episode``: a line in progress (main line, fold branch, tree line): its start, the model's turn.
- ``tree``: tree rollouts, lines that split into clones.
- ``branches``: fold's sub-tasks.
- ``turns``: each turn's start and state key, for turn-level credit.
- ``results``: the calls' results and parse errors as the tokens the model reads next.
- ``segments``: a trajectory in pieces: template forks and the context policy's edits.
- ``agent``: an agent program runs the episode instead, through the gateway.
- ``reward``: a finished trajectory's score, given to every piece.
- ``rollout_context``: each environment's :class:`Route` and the :class:`RolloutContext` holding them.
- ``routes``: the routes resolved from the config and built (rendering: :mod:`toolrl.renderers`).
- ``context_check``: prompts checked against the model's context before any model loads.
- ``teacher``: distillation's teachers, engines that score, built as the run's engine is.
"""

from toolrl.rollout.episode import prompt_of
from toolrl.rollout.loop import run_group, run_rollouts, run_trajectory, run_trajectory_pieces
from toolrl.rollout.rollout_context import RolloutContext, Route

__all__ = ["RolloutContext", "Route", "prompt_of", "run_group", "run_rollouts", "run_trajectory",
           "run_trajectory_pieces"]
