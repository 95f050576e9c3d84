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

from toolrl.config import RolloutConfig
from toolrl.rollout.episode import Episode, TreeLine
from toolrl.seeds import fork_seed
from toolrl.sessions import SessionTool
from toolrl.trajectory_ids import line_id, moved

__all__ = ["fork_due", "roots", "tree_lines"]


def roots(config: RolloutConfig, n: int) -> tuple[int, bool]:
    """The lines a rollout call for ``n`` trajectories per sample starts per sample, and whether they
    are trees' roots (module docstring)."""
    tree = config.tree
    if tree is None or n % tree.leaves:
        return n, False
    return n // tree.leaves, True


async def fork_due(ep: Episode, run_line: Callable[[Episode], Awaitable[Episode]]) -> None:
    """At a fork turn of a tree's line (with room left to generate): its copies, each run by
    ``run_line`` as a task of the tree; the line goes on as continuation 0."""
    tree, traj, line = ep.ctx.config.tree, ep.traj, ep.line
    if tree is None or not isinstance(line, TreeLine) or line.depth >= tree.depth or traj.turns != tree.turn + line.depth:
        return
    if ep.ctx.config.max_response_tokens <= ep.response_tokens or ep.context_room <= 0:
        return
    copies = await asyncio.gather(*(fork_episode(ep, line, c) for c in range(1, tree.width)))
    ep.ctx.engine.fork_session(traj.key, [c.traj.key for c in copies])
    ep.line, traj.branch_point = TreeLine(line.tree, line.depth + 1, line.path), len(traj.response_ids)
    line.tree.lines.extend(asyncio.ensure_future(run_line(c)) for c in copies)


async def fork_episode(ep: Episode, line: TreeLine, continuation: int) -> Episode:
    """Continuation ``continuation`` (from 1) of the tree line ``ep``: its own copies of the
    trajectory, session, tools, conversation, pieces and rewards, and its seed (module docstring)."""
    traj = ep.traj
    # Its path: the line's, a 0 for each fork the line made since it began, then ``continuation``.
    path = line.path + (0,) * (line.depth - len(line.path)) + (continuation,)
    tid = line_id(traj.key, path)
    session = await ep.session.fork(tid)
    tools = {name: SessionTool(session, tool.tool_schema.model_dump(exclude_none=True))
             if isinstance(tool, SessionTool) and tool.run is ep.session else tool
             for name, tool in ep.toolset.tools.items()}
    twin = traj.model_copy(deep=True, update={"trajectory_id": tid, "branch_point": len(traj.response_ids),
                                              "trajectory_key": tid if traj.trajectory_key else ""})
    closed = [p.model_copy(deep=True, update={"trajectory_id": moved(p.trajectory_id, tid), "trajectory_key": tid})
              for p in ep.closed]
    return Episode(ep.ctx, ep.route, ep.renderer, await ep.toolset.fork(tid, tools), twin,
                   fork_seed(ep.seed, traj.turns, continuation), session, copy.deepcopy(ep.messages),
                   list(ep.step_rewards), dict(ep.session_terms), closed, ep.task, TreeLine(line.tree, line.depth + 1, path))


async def tree_lines(ep: Episode, root: Awaitable[Episode], fresh: Callable[[str, int], Awaitable[Episode]],
                     run_line: Callable[[Episode, bool], Awaitable[Episode]]) -> list[Episode]:
    """``root`` (the run of ``ep``'s line), then, for a tree's root, every line forked in its tree once
    each has ended (a forked line may fork again): the tree's leaves, depth first (by their paths). A
    line that ended before the forks it had left is made up for (:func:`made_up`; ``fresh(id, seed)``
    starts a line from the prompt). Leaving early (an error that stops the run, a cancellation)
    cancels the lines still running."""
    lines = ep.line.tree.lines if isinstance(ep.line, TreeLine) else []
    try:
        made_up(await root, fresh, run_line)
        done = 0
        while done < len(lines):
            made_up(await lines[done], fresh, run_line)
            done += 1
    except BaseException:
        for task in lines:
            task.cancel()
        raise
    return [ep] + sorted((task.result() for task in lines), key=lambda e: e.line.path)


def made_up(ep: Episode, fresh: Callable[[str, int], Awaitable[Episode]],
            run_line: Callable[[Episode, bool], Awaitable[Episode]]) -> None:
    """A tree's line that ended before the forks it had left (it answered early, or failed) is one
    leaf where ``width ** forks_left`` were due: the others start afresh from the prompt, as flat
    leaves of the tree (``branch_point`` 0), so the group still holds ``rollout.n``. Leaf ``k`` (from 1)
    is seeded as continuation ``k`` of a fork of the line at turn 0."""
    tree, line = ep.ctx.config.tree, ep.line
    if tree is None or not isinstance(line, TreeLine) or line.depth >= tree.depth:
        return
    path = line.path + (0,) * (line.depth - len(line.path))

    async def leaf(k: int) -> Episode:
        made = await fresh(line_id(ep.traj.key, (*line.path, f"r{k}")), fork_seed(ep.seed, 0, k))
        made.traj.tree_id, made.traj.branch_point = ep.traj.tree_id, 0
        made.line = TreeLine(line.tree, tree.depth, path + (tree.width + k,))  # after the line's own copies
        return await run_line(made, True)

    line.tree.lines.extend(asyncio.ensure_future(leaf(k)) for k in range(1, tree.width ** (tree.depth - line.depth)))
