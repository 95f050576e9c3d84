"""Tree rollouts (``rollout.tree``, :class:`toolrl.config.TreeConfig`): a trajectory's prefix up to a
turn is generated once, and ``width`` continuations go on from it.

A tree's root is a line like any other (toolrl.rollout.loop). Before model turn ``turn`` it forks: it
goes on itself as continuation 0 and ``width - 1`` copies go on beside it, each a line of its own
(run concurrently, under the root's concurrency slot); every continuation forks again before the next
turn, ``depth`` forks in all. What a copy takes from its line:

- the trajectory so far (tokens, masks, logprobs, messages, pieces): copied; ``tree_id`` the line's,
  ``branch_point`` the response index where it left the line (the line's, its latest fork's);
- the engine's session: :meth:`toolrl.engines.RolloutEngine.fork_session`, so the shared prefix is not
  prefilled again (the transformers engine prefills the continuations' first turn once for all);
- the environment session: :meth:`toolrl.sessions.EnvironmentSession.fork`, under the session's guard;
- each tool's instance: :meth:`toolrl.tools.Tool.fork` (:meth:`toolrl.tools.ToolSet.fork`); a
  session's tools are bound to the forked session;
- its sampling seed: :func:`toolrl.seeds.fork_seed` (continuation 0 keeps the line's, so a tree's
  first leaf is the flat trajectory of the tree's seed).

Accounting. ``rollout.n`` stays the trajectories trained per prompt (the group): a group holds
``n / width ** depth`` trees of ``width ** depth`` leaves each (the config checks it divides). A
line that ends before a fork turn (it answered early, or failed) cannot fork: the leaves it would
have had beyond itself start afresh from the prompt (:func:`made_up`), so a group always holds
``n``. Per trained trajectory, a tree generates the turns before a fork once for its ``width``
continuations: against ``n`` flat trajectories, the tokens of the shared turns are saved
(``benchmarks/tree_rollouts.py``). A rollout call for a number of trajectories that trees do not
divide (an evaluation's ``eval.n``) runs flat.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import replace

from toolrl.config import RolloutConfig
from toolrl.rollout.episode import Episode
from toolrl.seeds import fork_seed
from toolrl.sessions import SessionTool
from toolrl.trajectory import Trajectory

__all__ = ["fork_due", "roots", "tree_lines"]


def roots(config: RolloutConfig, n: int) -> tuple[int, bool]:
    """The lines a rollout call for ``n`` trajectories per sample starts per sample, and whether they
    are trees' roots (module docstring)."""
    tree = config.tree
    if tree is None or n % tree.leaves:
        return n, False
    return n // tree.leaves, True


async def fork_due(ep: Episode, run_line: Callable[[Episode], Awaitable[Episode]]) -> None:
    """At a fork turn of a tree's line (not a fold branch; with room left to generate): its copies,
    each run by ``run_line`` as a task in the tree's ``lines``; the line goes on as continuation 0."""
    tree, traj = ep.ctx.config.tree, ep.traj
    if tree is None or traj.tree_id is None or ep.engine_session or ep.depth >= tree.depth \
            or traj.turns != tree.turn + ep.depth:
        return
    if ep.ctx.config.max_response_tokens <= ep.response_tokens or ep.context_room <= 0:
        return
    copies = await asyncio.gather(*(fork_episode(ep, c) for c in range(1, tree.width)))
    ep.ctx.engine.fork_session(traj.key, [c.traj.key for c in copies])
    ep.depth, traj.branch_point = ep.depth + 1, len(traj.response_ids)
    ep.lines.extend(asyncio.ensure_future(run_line(c)) for c in copies)


async def fork_episode(ep: Episode, continuation: int) -> Episode:
    """Continuation ``continuation`` (from 1) of ``ep``'s line: its trajectory, session, tools, pieces
    and seed (module docstring)."""
    traj = ep.traj
    # Its path: the line's, a 0 for each fork the line made since it began, then ``continuation``.
    path = ep.path + (0,) * (ep.depth - len(ep.path)) + (continuation,)
    tid = traj.key.removesuffix("".join(f".{i}" for i in ep.path)) + "".join(f".{i}" for i in path)
    session = await ep.session.fork(tid)
    tools = {name: SessionTool(session, tool.tool_schema.model_dump(exclude_none=True))
             if isinstance(tool, SessionTool) and tool.run is ep.session else tool
             for name, tool in ep.toolset.tools.items()}
    twin = traj.model_copy(deep=True, update={"trajectory_id": tid, "branch_point": len(traj.response_ids),
                                              "trajectory_key": tid if traj.trajectory_key is not None else None})
    return replace(ep, traj=twin, toolset=await ep.toolset.fork(tid, tools), session=session,
                   seed=fork_seed(ep.seed, traj.turns, continuation), messages=copy.deepcopy(ep.messages),
                   step_rewards=list(ep.step_rewards), session_terms=dict(ep.session_terms),
                   closed=[_piece_of(p, traj.key, tid) for p in ep.closed], depth=ep.depth + 1, path=path)


def _piece_of(piece: Trajectory, key: str, tid: str) -> Trajectory:
    """A closed piece of the line ``key``, as the continuation ``tid``'s."""
    return piece.model_copy(deep=True, update={"trajectory_id": tid + piece.trajectory_id[len(key):],
                                               "trajectory_key": tid})


async def tree_lines(ep: Episode, root: Awaitable[Episode], fresh: Callable[[str, int], Awaitable[Episode]],
                     run_line: Callable[[Episode, bool], Awaitable[Episode]]) -> list[Episode]:
    """``root`` (the run of ``ep``'s line), then every line forked in its tree once each has ended (a
    forked line may fork again): the tree's leaves, depth first (by their paths). A line that ended
    before the forks it had left is made up for (:func:`made_up`; ``fresh(id, seed)`` starts a line
    from the prompt). Leaving early (an error that stops the run, a cancellation) cancels the lines
    still running."""
    try:
        made_up(await root, fresh, run_line)
        done = 0
        while done < len(ep.lines):
            made_up(await ep.lines[done], fresh, run_line)
            done += 1
    except BaseException:
        for task in ep.lines:
            task.cancel()
        raise
    return [ep] + sorted((task.result() for task in ep.lines), key=lambda line: line.path)


def made_up(line: Episode, fresh: Callable[[str, int], Awaitable[Episode]],
            run_line: Callable[[Episode, bool], Awaitable[Episode]]) -> None:
    """A tree's line that ended before the forks it had left (it answered early, or failed) is one
    leaf where ``width ** forks_left`` were due: the others start afresh from the prompt, as flat
    leaves of the tree (``branch_point`` 0), so the group still holds ``rollout.n``. Leaf ``k`` (from 1)
    is seeded as continuation ``k`` of a fork of the line at turn 0."""
    tree = line.ctx.config.tree
    if tree is None or line.traj.tree_id is None or line.depth >= tree.depth:
        return
    path = line.path + (0,) * (line.depth - len(line.path))

    async def leaf(k: int) -> Episode:
        made = await fresh(f"{line.traj.key}.r{k}", fork_seed(line.seed, 0, k))
        made.traj.tree_id, made.traj.branch_point = line.traj.tree_id, 0
        made.depth, made.path = tree.depth, path + (tree.width + k,)  # after the line's own copies
        return await run_line(made, True)

    line.lines.extend(asyncio.ensure_future(leaf(k)) for k in range(1, tree.width ** (tree.depth - line.depth)))
