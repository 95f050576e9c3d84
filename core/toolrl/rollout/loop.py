"""The async multi-turn agent loop, top to bottom.

For each sample × n, concurrently::

    session reset (its tools, first messages) ─► render prompt (tools=)              start_episode (episode)
    create tools (sample's tools_kwargs)                                              run_trajectory_pieces
      ┌─► (a run with roles) the session's role for the turn; another starts a piece  act_as (segments)
      │   engine.generate ─► append model tokens (mask 1, engine logprobs)           generate (episode)
      │   parse ─► no calls and no errors: the session's user turn (mask 0), else    parse_calls, user_turn
      │            the answer ends it
      │   run calls concurrently (≤ max_parallel_calls; the rest are reported);      execute
      │   a session step that says done ends it
      │   append tool results and parse errors as a token delta (mask 0, logprob 0)  tool_results_delta (results)
      └── the context policy may edit the context: a new segment (toolrl.context)    fit_context (segments)
          (fold: a branch call runs its sub-task as a segment of its own)              run_branch (branches)
          (rollout.tree: at a split turn, clones of the line go on beside it)          split_due (tree)
    calc_reward/release, session score/close, always ─► score (toolrl.rewards.scoring) finish_tools, score_pieces
    (scored outside the concurrency slot; async reward functions are awaited, the loop going on)

``take_turn`` is one turn of the loop, and every reason a trajectory ends is decided there. With
``rollout.agent`` a program runs each episode instead (toolrl.rollout.agent). Trajectories never wait
for each other: the engine batches whatever generation requests are pending, so one trajectory
waiting on a slow tool does not hold up the others' generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from toolrl.context import Branch
from toolrl.engines import Generation
from toolrl.parsers import parse_within
from toolrl.renderers.rewrite import TemplateRewriteError
from toolrl.rollout.agent import run_agent_trajectory
from toolrl.rollout.branches import branch_of, close_branch, open_branch
from toolrl.rollout.episode import Episode, FoldBranch, Tree, TreeLine, answer_of, generate, start_episode
from toolrl.rollout.results import tool_results_delta
from toolrl.rollout.reward import score_pieces
from toolrl.rollout.rollout_context import RolloutContext
from toolrl.rollout.segments import act_as, check_history, fit_context
from toolrl.rollout.tree import roots, split_due, tree_lines
from toolrl.schemas import InfrastructureError, ParseError, Sample, ToolCall, ToolResponse, ToolResult
from toolrl.seeds import trajectory_seed
from toolrl.sessions import failure_after_calls
from toolrl.trajectory import Termination, Trajectory, append_tokens, root_id


async def run_rollouts(ctx: RolloutContext, samples: Sequence[Sample], n: int, seed: int,
                       id_prefix: str = "") -> list[Trajectory]:
    """``n`` trajectories per sample (group ``g`` is sample ``g``), at most max_concurrent_trajectories at once."""
    limit = asyncio.Semaphore(ctx.config.max_concurrent_trajectories)
    groups = await asyncio.gather(*(run_group(ctx, s, g, n, seed, id_prefix, limit) for g, s in enumerate(samples)))
    return [t for group in groups for t in group]


async def run_group(ctx: RolloutContext, sample: Sample, group: int, n: int, seed: int, id_prefix: str,
                    limit: asyncio.Semaphore) -> list[Trajectory]:
    """The ``n`` trajectories of one group, concurrent; ``limit`` bounds the trajectories running at
    once across every group that shares it. Seeds and ids are those :func:`run_rollouts` gives."""
    lines, trees = roots(ctx.config, n)  # rollout.tree: n / leaves trees (toolrl.rollout.tree)
    return [p for pieces in await asyncio.gather(*(run_trajectory_pieces(
        ctx, sample, group, root_id(id_prefix, sample.index, group, k), trajectory_seed(seed, group, k), limit,
        k if trees else None) for k in range(lines))) for p in pieces]


async def run_trajectory(ctx: RolloutContext, sample: Sample, group: int, trajectory_id: str, seed: int) -> Trajectory:
    """One trajectory of ``sample`` in one piece (its last piece if it forked)."""
    return (await run_trajectory_pieces(ctx, sample, group, trajectory_id, seed))[-1]


async def run_trajectory_pieces(ctx: RolloutContext, sample: Sample, group: int, trajectory_id: str, seed: int,
                                slot: AbstractAsyncContextManager[Any] | None = None,
                                tree_id: int | None = None) -> list[Trajectory]:
    """One trajectory of ``sample``: its session's reset, turns until one ends it, the tools' and the
    session's finish (always), the score. Its pieces in order: one, unless it forked. ``slot`` (bounding
    the trajectories that run at once) is held until the tools and the session are finished, not while
    it is scored: a slow reward (a judge) keeps no other from starting. With ``tree_id`` (rollout.tree)
    it is a tree's root: the pieces of every leaf, in the tree's order, the tree under the one slot."""
    route = ctx.route_for(sample)
    if route.agent is not None:  # a program runs the episode; the gateway records it
        return await run_agent_trajectory(ctx, route, sample, group, trajectory_id, seed, slot)
    async with slot or contextlib.nullcontext():
        ep = await start_episode(ctx, route, sample, group, trajectory_id, seed)
        ep.traj.tree_id, ep.line = tree_id, ep.line if tree_id is None else TreeLine(Tree())
        fresh = functools.partial(start_episode, ctx, route, sample, group)  # a tree's lines from the prompt
        leaves = await tree_lines(ep, run_line(ep, start=True), fresh, run_line)  # one, unless rollout.tree splits
    scored = await asyncio.gather(*(score_pieces(route, sample, e.closed, e.traj, e.step_rewards, e.session_terms,
                                                 e.session.role_rewards) for e in leaves))
    return [p for pieces in scored for p in pieces]


async def run_line(ep: Episode, start: bool = False) -> Episode:
    """A line's turns until one ends it (``start``: its tools' start first; a tree's clones
    come with theirs), then the tools' and the session's finish, always."""
    traj = ep.traj
    try:
        if ep.session.error is not None:
            raise ep.session.failed()
        if start:
            await ep.toolset.start()
        ep.toolset.check_infrastructure()  # a tool whose server is down: nothing to train on
        traj.termination = await run_turns(ep)
    except TemplateRewriteError:
        raise  # template_rewrite: refuse stops the run
    except Exception as exc:  # a broken engine/tool/session must not take the other trajectories down
        # toolrl.schemas.InfrastructureError: the environment failed, not the model (not trained).
        traj.termination = "infra_error" if isinstance(exc, InfrastructureError) else "error"
        traj.error = f"{type(exc).__name__}: {exc}"
    finally:
        await finish_tools(ep)
    return ep


async def run_turns(ep: Episode) -> Termination:
    """Turns until one ends the episode (the main line's, or a branch's): why it ended."""
    ending = None
    while ending is None:
        await split_due(ep, run_line)  # rollout.tree: at a split turn, clones go on beside this line
        ending = await take_turn(ep)
    return ending


async def take_turn(ep: Episode) -> Termination | None:
    """One turn: generate, parse, run the calls, append their results. Returns why the trajectory
    ends here, or None to take another turn."""
    cfg, traj = ep.ctx.config, ep.traj
    budget = cfg.max_response_tokens - ep.response_tokens
    if budget <= 0:
        return "max_response_tokens"
    if ep.context_room <= 0:
        return "length"
    if ep.ctx.roles:  # the role that takes this turn: another than the piece's starts a new piece
        await act_as(ep)
    gen = await generate(ep, min(budget, ep.context_room))
    calls, errors = await parse_calls(ep, gen)
    if gen.finish_reason == "length":  # out of tokens: the whole response's, or this call's
        return "max_response_tokens" if len(traj.response_ids) >= cfg.max_response_tokens else "length"
    if not calls and not errors:  # no call and no malformed one: its answer
        if isinstance(ep.line, FoldBranch):  # its answer goes back to the line that called it, not to the session
            traj.final_response = await answer_of(ep, gen)
            return "answered"
        return await user_turn(ep, gen) or await fit_context(ep)
    results = await execute(ep, calls)
    if (failure := failure_after_calls(ep.session, results)) is not None:  # a failed session ends it at once
        raise failure
    if ep.session.done:  # the environment ended the episode
        return "done"
    if traj.turns >= ep.route.max_turns:  # no further generation would read the results
        return "max_turns"
    delta, images = tool_results_delta(ep, results, errors, [c.id for c in calls])
    if ep.response_tokens + len(delta) >= cfg.max_response_tokens:
        return "max_response_tokens"
    append_tokens(traj, delta, [0] * len(delta), [0.0] * len(delta))
    traj.images += images
    check_history(ep)
    return await fit_context(ep)


async def parse_calls(ep: Episode, gen: Generation) -> tuple[list[ToolCall], list[ParseError]]:
    """The calls to run and the parse errors to report to the model; sets the final answer. Inline
    tags resume inside the same assistant turn, so only a call closed by this generation's stop
    string runs, and the final answer is the turn's model text."""
    parser, traj, renderer = ep.parser, ep.traj, ep.renderer
    seconds = ep.ctx.config.parser_timeout_s
    parsed = await parse_within(parser, traj.model_text[-1], seconds)  # a parser that fails: this turn's error
    if parser.result_mode != "inline":
        traj.final_response = parsed.content
        traj.parse_errors += parsed.errors
        calls = renderer.with_call_ids(parsed.calls, f"{traj.trajectory_id}:{traj.turns}")
        ep.messages.append(renderer.assistant_message(gen.token_ids, parsed.model_copy(update={"calls": calls})))
        return calls, parsed.errors
    ep.messages.append(renderer.assistant_message(gen.token_ids))
    model_ids = [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
    traj.final_response = (await parse_within(parser, ep.renderer.decode(model_ids), seconds)).content
    stopped_at_call = gen.finish_reason == "stop_string" and bool(parsed.calls)
    calls = parsed.calls[-1:] if stopped_at_call else []
    errors = parsed.errors if gen.finish_reason == "stop_string" and not stopped_at_call else []
    traj.parse_errors += parsed.errors if not stopped_at_call else []
    return calls, errors


async def user_turn(ep: Episode, gen: Generation) -> Termination | None:
    """After an answer: the session's next user turn (a simulated user) joins the response as
    environment tokens (mask 0) and the model takes another turn; no user turn: the answer ends the
    trajectory. The session reads the answer as its parsed content, without the end-of-turn token."""
    traj = ep.traj
    reply = await ep.session.respond(await answer_of(ep, gen))
    if reply is None:
        return "answered"
    traj.user_turns.append(reply)
    if traj.turns >= ep.route.max_turns:
        return "max_turns"
    message = {"role": "user", "content": reply}
    delta = ep.renderer.tool_delta([message])
    if ep.response_tokens + len(delta) >= ep.ctx.config.max_response_tokens:
        return "max_response_tokens"
    ep.messages.append(message)
    append_tokens(traj, delta, [0] * len(delta), [0.0] * len(delta))
    check_history(ep)
    return None


async def execute(ep: Episode, calls: Sequence[ToolCall]) -> list[ToolResult]:
    """Run the calls concurrently; calls over the per-turn limit are reported, not dropped."""
    limit, traj = ep.ctx.config.max_parallel_calls, ep.traj
    taken, over = calls[:limit], calls[limit:]
    opened = [branch_of(ep, c) for c in taken]  # fold's branch calls are the loop's, run after the tools'
    t0 = time.perf_counter()
    called = iter(await asyncio.gather(*(ep.toolset.call(c) for c, o in zip(taken, opened) if o is None)))
    traj.tool_s += time.perf_counter() - t0
    results = [next(called) if o is None else o if isinstance(o, ToolResult) else await run_branch(ep, *o)
               for o in opened]
    results += [_refused(c, limit) for c in over]
    results = [r.model_copy(update={"turn": traj.turns}) for r in results]  # per-turn success (toolrl eval)
    traj.tool_results += results
    ep.step_rewards += [r.step_reward for r in results]
    return results


async def run_branch(ep: Episode, call: ToolCall, branch: Branch) -> ToolResult:
    """Run a fold sub-task in a branch (toolrl.rollout.branches): its own turns and engine session
    (forgotten when it ends), the trajectory's tools; its answer is ``call``'s result."""
    sub = open_branch(ep, branch)
    try:
        ending = await run_turns(sub)
    finally:
        ep.ctx.engine.end_session(sub.traj.trajectory_id)
    return close_branch(ep, sub, call, branch, ending)


async def finish_tools(ep: Episode) -> None:
    """calc_reward and release, then the session's score and close, always (also after errors,
    timeouts or cancellation); the tools' rewards and errors go into the trajectory, the session's
    score into ``session_terms``, and the engine forgets its session."""
    traj, toolset = ep.traj, ep.toolset
    traj.tool_rewards = await asyncio.shield(toolset.finish())
    traj.tool_errors = {**toolset.create_errors, **toolset.finish_errors}
    traj.reward_parts = dict(toolset.reward_parts)
    traj.loop_blocked_s = sum(r.loop_blocked_s for r in traj.tool_results)
    if traj.tool_errors and traj.error is None:
        traj.error = "; ".join(f"tool {n}: {e}" for n, e in sorted(traj.tool_errors.items()))
    if toolset.infrastructure is not None:  # e.g. calc_reward could not reach its server: no reward to train on
        traj.termination, traj.error = "infra_error", traj.error or toolset.infrastructure
    ep.session_terms = await asyncio.shield(ep.session.finish(traj, ep.ctx.roles))
    ep.ctx.engine.end_session(traj.key)


def _refused(call: ToolCall, limit: int) -> ToolResult:
    return ToolResult(name=call.name, arguments=call.arguments, status="error", response=ToolResponse.error(
        f"Error: at most {limit} tool calls run per turn; this call to '{call.name}' was not run. "
        "Make it in your next turn."))
