"""Fold's branches: a branch call (the context policy's tool) runs its sub-task as a segment of its own,
prompted with the branch's messages; its answer is the call's result, and the calling line goes on
without its turns, which the turn loop runs between :func:`open_branch` and :func:`close_branch`."""

from __future__ import annotations

from dataclasses import replace

from toolrl.context import Branch, ContextView
from toolrl.rollout.episode import Episode, FoldBranch
from toolrl.rollout.segments import ContextError
from toolrl.schemas import ToolCall, ToolResponse, ToolResult
from toolrl.seeds import branch_seed
from toolrl.trajectory import ContextEdit, Termination, Trajectory, cut_response, model_tokens_end, part_id


def branch_of(ep: Episode, call: ToolCall) -> tuple[ToolCall, Branch] | ToolResult | None:
    """The branch ``call`` opens under the context policy (fold), an error result for a branch call
    with bad arguments, or None: a call of the trajectory's tools."""
    policy = ep.route.context
    if policy is None:
        return None
    try:
        branch = policy.branch(ContextView(list(ep.messages), ep.task, ep.context_tokens, ep.traj.turns), call)
    except ValueError as exc:
        return ToolResult(name=call.name, arguments=call.arguments, status="invalid_arguments",
                          response=ToolResponse.error(f"Error: {exc}"))
    return None if branch is None else (call, branch)


def open_branch(ep: Episode, branch: Branch) -> Episode:
    """The branch's episode: the trajectory's tools and session, its own turn limit, its own engine
    session (its id, so the engine keeps the main line's KV), and a new segment that records the edit."""
    traj, policy = ep.traj, ep.route.context
    if traj.images or ep.parser.result_mode == "inline" or policy is None:
        raise ContextError("context policies edit conversations of chat turns without images: this trajectory "
                           + ("holds images" if traj.images else "calls tools inline"))
    prompt = ep.renderer.conversation_ids(branch.messages)
    record = ContextEdit(policy=policy.name, action="fold", turn=traj.turns, tokens_before=ep.context_tokens,
                         tokens_after=len(prompt), task=branch.task)
    twig = Trajectory(trajectory_id=part_id(traj.key, "branch", len(ep.closed)), trajectory_key=traj.key,
                      sample_index=traj.sample_index, group=traj.group, env=traj.env, prompt_ids=prompt,
                      ground_truth=traj.ground_truth, edit=record, role=traj.role)  # the caller's role goes on
    return Episode(ep.ctx, replace(ep.route, max_turns=branch.max_turns), ep.renderer, ep.toolset, twig,
                   branch_seed(ep.seed, len(ep.closed) + 1), ep.session, list(branch.messages), ep.step_rewards,
                   ep.session_terms, ep.closed, ep.task, FoldBranch(  # the tokens of the lines that wait on it
                       ep.response_tokens - sum(len(p.response_ids) for p in ep.closed)), parser=ep.parser)


def close_branch(ep: Episode, sub: Episode, call: ToolCall, branch: Branch, ending: Termination) -> ToolResult:
    """Close the branch ``sub`` (numbered as it closes) after its last model token; its answer, cut to
    ``max_result_tokens``, is ``call``'s result."""
    traj, twig = ep.traj, sub.traj
    answer = ep.renderer.truncate(twig.final_response.strip(), branch.max_result_tokens, "keep_head") \
        if ending == "answered" else f"Error: the branch ended without an answer ({ending})"
    assert twig.edit is not None
    twig.edit.result = answer
    piece = len(ep.closed)
    cut_response(twig, model_tokens_end(twig.response_mask))  # what follows its answer trains nothing
    twig.trajectory_id, twig.piece, twig.termination = part_id(traj.key, "piece", piece), piece, "forked"
    ep.closed.append(twig)
    traj.trajectory_key, traj.piece = traj.key, piece + 1
    return ToolResult(name=call.name, arguments=call.arguments, response=ToolResponse(text=answer),
                      status="ok" if ending == "answered" else "error")
