"""Tree rollouts (``rollout.tree``; docs/rollouts.md#tree-rollouts): before model turn ``turn`` a tree's
line splits: it goes on as continuation 0 and ``width - 1`` clones of it beside it (its trajectory,
conversation, pieces and rewards copied; its engine session, environment session and tools cloned),
each splitting again at the next turn, ``depth`` splits in all, under the root's concurrency slot. A
line that ends before a split cannot split: its missing leaves start afresh from the prompt."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable

from toolrl.config import RolloutConfig
from toolrl.rollout.episode import Episode, TreeLine
from toolrl.seeds import continuation_seed
from toolrl.sessions import SessionTool
from toolrl.trajectory import line_id, made_up_id, moved_id

__all__ = ["split_due", "roots", "tree_lines"]


def roots(config: RolloutConfig, n: int) -> tuple[int, bool]:
    """The lines a rollout call for ``n`` trajectories per sample starts per sample; whether they are trees."""
    tree = config.tree
    if tree is None or n % tree.leaves:
        return n, False
    return n // tree.leaves, True


async def split_due(ep: Episode, run_line: Callable[[Episode], Awaitable[Episode]]) -> None:
    """At a split turn of a tree's line (with room left to generate): its clones, each run by
    ``run_line`` as a task of the tree; the line goes on as continuation 0."""
    tree, traj, line = ep.ctx.config.tree, ep.traj, ep.line
    if tree is None or not isinstance(line, TreeLine) or len(line.path) >= tree.depth \
            or traj.turns != tree.turn + len(line.path):
        return
    if ep.ctx.config.max_response_tokens <= ep.response_tokens or ep.context_room <= 0:
        return
    clones = await asyncio.gather(*(clone_line(ep, line, c) for c in range(1, tree.width)))
    ep.ctx.engine.clone_session(traj.key, [c.traj.key for c in clones])
    ep.line, traj.split_point = TreeLine(line.tree, (*line.path, 0)), len(traj.response_ids)
    line.tree.extend(asyncio.ensure_future(run_line(c)) for c in clones)


async def clone_line(ep: Episode, line: TreeLine, continuation: int) -> Episode:
    """Continuation ``continuation`` (from 1) of the tree line ``ep``, a clone of it (module docstring)."""
    traj, path = ep.traj, (*line.path, continuation)
    tid = line_id(traj.key, path)
    session = await ep.session.clone(tid)
    tools = {name: SessionTool(session, tool.tool_schema.model_dump(exclude_none=True))
             if isinstance(tool, SessionTool) and tool.session_run is ep.session else tool
             for name, tool in ep.toolset.tools.items()}
    twin = traj.model_copy(deep=True, update={"trajectory_id": tid, "split_point": len(traj.response_ids),
                                              "trajectory_key": tid if traj.trajectory_key else ""})
    closed = [p.model_copy(deep=True, update={"trajectory_id": moved_id(p.trajectory_id, tid), "trajectory_key": tid})
              for p in ep.closed]
    return Episode(ep.ctx, ep.route, ep.renderer, await ep.toolset.clone(tid, tools), twin,
                   continuation_seed(ep.seed, traj.turns, continuation), session, copy.deepcopy(ep.messages),
                   list(ep.step_rewards), dict(ep.session_terms), closed, ep.task, TreeLine(line.tree, path),
                   parser=ep.parser)


async def tree_lines(ep: Episode, root: Awaitable[Episode], fresh: Callable[[str, int], Awaitable[Episode]],
                     run_line: Callable[[Episode, bool], Awaitable[Episode]]) -> list[Episode]:
    """``root`` (the run of ``ep``'s line), then, for a tree's root, each line of its tree once it ended,
    made up for (:func:`made_up`; ``fresh(id, seed)`` starts a line from the prompt): the tree's leaves,
    by their paths. Leaving early (an error that stops the run, a cancellation) cancels the others."""
    lines = ep.line.tree if isinstance(ep.line, TreeLine) else []
    try:
        made_up(await root, fresh, run_line)
        for line in lines:  # the list grows while its lines split: iterating it reaches every one
            made_up(await line, fresh, run_line)
    except BaseException:
        for task in lines:
            task.cancel()
        raise
    return [ep] + sorted((task.result() for task in lines), key=lambda e: e.line.path)


def made_up(ep: Episode, fresh: Callable[[str, int], Awaitable[Episode]],
            run_line: Callable[[Episode, bool], Awaitable[Episode]]) -> None:
    """A tree's line that ended before the splits it had left is one leaf where ``width ** left`` were
    due: the others start afresh from the prompt (``split_point`` 0), so the group still holds
    ``rollout.n``; leaf ``k`` (from 1) is seeded as continuation ``k`` of a split at turn 0."""
    tree, line = ep.ctx.config.tree, ep.line
    if tree is None or not isinstance(line, TreeLine) or len(line.path) >= tree.depth:
        return

    async def leaf(k: int) -> Episode:  # after the line's own clones, at the tree's depth: it never splits
        made = await fresh(made_up_id(ep.traj.key, k), continuation_seed(ep.seed, 0, k))
        made.traj.tree_id, made.traj.split_point = ep.traj.tree_id, 0
        made.line = TreeLine(line.tree, (*line.path, tree.width + k, *[0] * (left - 1)))
        return await run_line(made, True)

    left = tree.depth - len(line.path)
    line.tree.extend(asyncio.ensure_future(leaf(k)) for k in range(1, tree.width ** left))
