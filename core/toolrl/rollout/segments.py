"""Segments: a trajectory's tokens in pieces, each trained with its reward. The live piece is closed
(:func:`close_segment`: the trajectory forks) and the next starts from the template's rendering of the
conversation when the template re-renders history differently (``rollout.template_rewrite``:
:func:`check_history`) or the context policy edits the context (:func:`fit_context`), and from the whole
context when another role takes the turn (:func:`act_as`: one role per piece)."""

from __future__ import annotations

from toolrl.context import ContextPlan, ContextPolicy, ContextView
from toolrl.renderers.chat import TemplateError
from toolrl.renderers.rewrite import first_difference, refusal
from toolrl.rollout.episode import Episode, generate, images_in
from toolrl.trajectory import (
    ContextEdit,
    Termination,
    Trajectory,
    append_tokens,
    cut_response,
    model_tokens_end,
    part_id,
)


class ContextError(RuntimeError):
    """A context edit that cannot be made; it ends its trajectory with an error."""


async def fit_context(ep: Episode) -> Termination | None:
    """Show the context policy the live conversation and make its edit, if any. The trajectory ends
    (``length``) when its context leaves no room for the next generation; the tokens after its last
    model token, which no generation read, are cut so that it holds at most ``model.max_context``."""
    policy, traj = ep.route.context, ep.traj
    if policy is None:
        return None
    plan = policy.plan(ContextView(list(ep.messages), ep.task, ep.context_tokens, traj.turns))
    if plan is not None:
        ending = await edit_context(ep, policy, plan)
        if ending is not None:
            return ending
    if ep.context_room > 0:
        return None
    cut_response(traj, model_tokens_end(traj.response_mask))
    traj.images = images_in(ep.renderer, traj.images, traj.prompt_ids + traj.response_ids)
    return "length"


async def edit_context(ep: Episode, policy: ContextPolicy, plan: ContextPlan) -> Termination | None:
    """Close the live segment and continue from the edited conversation, rendered by the template, as
    a new segment. A plan that asks the model first (a summary) gets the request as a user turn
    (mask 0) and the reply as a generated turn (mask 1, trained in the segment it closes)."""
    traj, messages, summary = ep.traj, plan.messages, None
    if traj.images or ep.parser.result_mode == "inline":
        raise ContextError("context policies edit conversations of chat turns without images: this trajectory "
                           + ("holds images" if traj.images else "calls tools inline"))
    if plan.ask is not None and plan.then is not None:
        ask_model(ep, plan.ask)
        left = ep.ctx.config.max_response_tokens - ep.response_tokens
        if left <= 0 or ep.context_room <= 0:
            return "max_response_tokens" if left <= 0 else "length"
        budget = min(left, ep.context_room, plan.max_reply_tokens or ep.ctx.config.max_new_tokens)
        gen = await generate(ep, budget)
        summary = ep.renderer.turn_text(gen.token_ids)
        ep.messages.append(ep.renderer.assistant_message(gen.token_ids))
        messages = plan.then(summary)
    if messages is None:
        raise ContextError(f"context policy {policy.name!r}: its plan holds no messages and no request")
    rendered = ep.renderer.conversation_ids(messages)
    record = ContextEdit(policy=policy.name, action=plan.action, turn=traj.turns, removed=plan.removed,
                         tokens_before=ep.context_tokens, tokens_after=len(rendered), summary=summary)
    close_segment(ep, rendered)
    ep.messages, traj.edit = list(messages), record
    return None


def ask_model(ep: Episode, request: str) -> None:
    """Append ``request`` as a user turn. The live tokens end in the generation prompt the last
    delta opened, so what follows the last model token is replaced by the template's rendering of
    the conversation with the request (mask 0)."""
    traj = ep.traj
    ep.messages.append({"role": "user", "content": request})
    rendered = ep.renderer.conversation_ids(ep.messages)
    keep = model_tokens_end(traj.response_mask)
    if first_difference(rendered[:len(traj.prompt_ids) + keep], traj.prompt_ids + traj.response_ids[:keep]) is not None:
        raise ContextError("the chat template re-renders the conversation differently from the trajectory's "
                           "tokens, so a request cannot be appended (set rollout.template_rewrite to fork)")
    cut_response(traj, keep)
    tail = rendered[len(traj.prompt_ids) + keep:]
    append_tokens(traj, tail, [0] * len(tail), [0.0] * len(tail))


def check_history(ep: Episode) -> None:
    """Compare the template's rendering of the conversation so far with the trajectory's tokens and
    apply ``rollout.template_rewrite`` (toolrl.renderers.rewrite) when they differ."""
    traj = ep.traj
    if ep.parser.result_mode == "inline":  # one assistant turn: nothing is re-rendered
        return
    traj.template_checks += 1
    try:  # gpt-oss's template refuses turns written as raw harmony text
        rendered = ep.renderer.conversation_ids(ep.messages, [i.grid_thw for i in traj.images])
    except Exception as exc:
        traj.template_rewrites += 1
        if ep.ctx.config.template_rewrite == "keep":
            return
        raise TemplateError(f"turn {traj.turns}: the chat template cannot re-render the conversation "
                            f"({type(exc).__name__}: {exc})") from None
    live = traj.prompt_ids + traj.response_ids
    position = first_difference(rendered, live)
    if position is None:
        return
    traj.template_rewrites += 1
    if ep.ctx.config.template_rewrite == "refuse":
        raise refusal(traj.turns, position, rendered, live, ep.renderer.decode)
    if ep.ctx.config.template_rewrite != "keep":
        close_segment(ep, rendered)
        traj.template_forks += 1


async def act_as(ep: Episode) -> None:
    """In a run with roles, before a model turn: the role the session gives the turn (None: the one
    acting goes on; at the start the data row's, else the run's first) is the live piece's. Another
    role than the piece's closes it, and the next piece's prompt is the whole context so far (under
    model.adapters it runs through the new role's adapter, so a piece never holds two roles' tokens)."""
    traj = ep.traj
    role = await ep.session.role(ep.ctx.roles) or traj.role
    if role != traj.role and any(traj.response_mask):
        close_segment(ep, traj.prompt_ids + traj.response_ids)
        if ep.ctx.adapters:  # the engine's cache of this context holds the other adapter's keys and values
            ep.ctx.engine.end_session(traj.trajectory_id)
    traj.role = role


def close_segment(ep: Episode, rendered: list[int]) -> None:
    """Close the live piece after its last model token; the next piece's prompt is ``rendered`` (a
    template fork's re-rendering, or a context edit's)."""
    traj, piece = ep.traj, len(ep.closed)  # pieces are numbered as they close (a branch's among them)
    end = model_tokens_end(traj.response_mask)
    ep.closed.append(Trajectory(
        trajectory_id=part_id(traj.key, "piece", piece), trajectory_key=traj.key, piece=piece,
        sample_index=traj.sample_index, group=traj.group, env=traj.env, prompt_ids=traj.prompt_ids,
        images=images_in(ep.renderer, traj.images, traj.prompt_ids + traj.response_ids[:end]),
        response_ids=traj.response_ids[:end], response_mask=traj.response_mask[:end], logprobs=traj.logprobs[:end],
        termination="forked", ground_truth=traj.ground_truth, policy_versions=traj.policy_versions,
        prefill_tokens_saved=traj.prefill_tokens_saved, routed_experts=traj.routed_experts,
        edit=traj.edit, turn_starts=traj.turn_starts, turn_states=traj.turn_states, role=traj.role))
    traj.trajectory_key, traj.piece = traj.key, piece + 1
    traj.prompt_ids, traj.response_ids, traj.response_mask, traj.logprobs = rendered, [], [], []
    traj.policy_versions, traj.prefill_tokens_saved, traj.routed_experts, traj.edit = [], 0, None, None
    traj.turn_starts, traj.turn_states = [], []
