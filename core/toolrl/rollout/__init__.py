"""The async multi-turn agent loop, top to bottom.

For each sample × n, concurrently::

    session reset (its tools, first messages) ─► render prompt (tools=)              start_episode
    create tools (sample's tools_kwargs)                                              run_trajectory
      ┌─► engine.generate ─► append model tokens (mask 1, engine logprobs)           generate
      │   parse ─► no calls and no errors: the session's user turn (mask 0), else    parse, ending_after_generation,
      │            the answer ends it                                                 user_turn
      │   run calls concurrently (≤ max_parallel_calls; the rest are reported);      execute
      │   a session step that says done ends it
      │   append tool results and parse errors as a token delta (mask 0, logprob 0)  tool_results_delta
      └── the context policy may edit the context: a new segment (toolrl.context)    fit_context, edit_context
          (fold: a branch call runs its sub-task as a segment of its own)              run_branch
    calc_reward/release, session score/close, always ─► score (toolrl.rewards.scoring) finish_tools, score
    (scored outside the concurrency slot; async reward functions are awaited, the loop going on)

``take_turn`` is one turn of the loop, and every reason a trajectory ends is decided there. With
``rollout.agent`` a program runs each episode instead (``run_agent_trajectory``): its model calls go
through the gateway (toolrl.gateway), which records them as the trajectory, scored as any other.

Trajectories never wait for each other: the engine batches whatever generation requests are pending,
so one trajectory waiting on a slow tool does not hold up the others' generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from toolrl.agents import Agent
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.context import Branch, ContextPlan, ContextPolicy, ContextView
from toolrl.engines import Generation, RolloutEngine, SamplingParams
from toolrl.gateway.run import run_agent_episode
from toolrl.gateway.server import Gateway
from toolrl.images import IMAGE_PLACEHOLDER, ImageError, ImageLimits, images_held, prepare
from toolrl.parsers import ToolParser, parse_within
from toolrl.rewards import scoring
from toolrl.rollout.chat import ChatRenderer, TemplateError
from toolrl.rollout.rewrite import TemplateRewriteError, first_difference, refusal
from toolrl.schemas import (
    InfrastructureError,
    ParseError,
    Sample,
    ToolCall,
    ToolKwargs,
    ToolResponse,
    ToolResult,
)
from toolrl.seeds import branch_seed, trajectory_seed, turn_seed
from toolrl.sessions import SessionError, SessionKind, SessionRun, failure_after_calls
from toolrl.tools import Tool, ToolSet
from toolrl.trajectory import (
    ContextEdit,
    Termination,
    Trajectory,
    TrajectoryImage,
    append_tokens,
    cut_response,
    model_tokens_end,
)

MAX_RENDERERS = 256  # tool sets whose renderer is kept


@dataclass
class Route:
    """What a sample's environment selects (seed 003's env map): its tools, parser, rewards, turn
    limit and environment session kind. ``RolloutContext.routes`` maps environment names to routes;
    ``None`` is the route of samples that name no environment."""

    tools: dict[str, Tool]
    max_turns: int
    parser: ToolParser
    reward_functions: list[tuple[str, float, Any]]  # (name, weight, callable)
    reward_config: RewardConfig
    session: SessionKind | None = None
    context: ContextPolicy | None = None  # None: no edits and no cap but the engine's
    agent: Agent | None = None  # a program runs each episode through the gateway (toolrl.gateway)


@dataclass
class RolloutContext:
    engine: RolloutEngine
    renderer_factory: Any  # (tool schemas) -> ChatRenderer; renderers are cached per tool set
    config: RolloutConfig
    routes: dict[str | None, Route]
    _renderers: dict[str, ChatRenderer] = field(default_factory=dict)
    _gateway: Any = None  # started by the first agent episode (toolrl.gateway.server.Gateway)

    def route_for(self, sample: Sample) -> Route:
        if sample.env in self.routes:
            return self.routes[sample.env]
        if sample.env is not None:
            raise KeyError(f"sample's environment {sample.env!r} is not configured "
                           f"(configured: {', '.join(str(n) for n in self.routes if n is not None) or 'none'})")
        if None not in self.routes:
            raise KeyError("the sample names no environment (extra_info.env) and the config mixes several")
        return self.routes[None]

    def renderer(self, route: Route, tools: dict[str, Tool] | None = None) -> ChatRenderer:
        """The renderer of ``tools`` (default: the route's; a session may hand out others per
        trajectory), cached by their schemas: what the template renders."""
        tools = route.tools if tools is None else tools
        # Inline-tag parsers describe their markers in the prompt; schemas are for chat-mode tools.
        schemas = [t.tool_schema.model_dump(exclude_none=True) for t in tools.values()] \
            if route.parser.result_mode == "chat" else []
        if route.context is not None and route.parser.result_mode == "chat":
            schemas += route.context.tool_schemas()  # fold's branch tool
        return self.schema_renderer(schemas)

    def schema_renderer(self, schemas: Sequence[dict[str, Any]]) -> ChatRenderer:
        """The renderer of these tool schemas (cached: what the template renders)."""
        key = json.dumps(list(schemas), sort_keys=True)
        if key not in self._renderers:
            if len(self._renderers) >= MAX_RENDERERS:  # tools that change per episode: keep the newest
                del self._renderers[next(iter(self._renderers))]
            self._renderers[key] = self.renderer_factory(list(schemas))
        return self._renderers[key]

    async def gateway(self) -> Any:
        """This context's gateway (toolrl.gateway), started on first use."""
        if self._gateway is None:
            gateway = Gateway()
            await gateway.start()
            self._gateway = gateway
        return self._gateway

    async def close(self) -> None:
        if self._gateway is not None:
            await self._gateway.close()
            self._gateway = None


async def run_trajectory(ctx: RolloutContext, sample: Sample, group: int, trajectory_id: str, seed: int,
                         slot: AbstractAsyncContextManager[Any] | None = None) -> Trajectory:
    """One trajectory of ``sample`` in one piece (its last piece if it forked)."""
    return (await run_trajectory_pieces(ctx, sample, group, trajectory_id, seed, slot))[-1]


async def run_trajectory_pieces(ctx: RolloutContext, sample: Sample, group: int, trajectory_id: str, seed: int,
                                slot: AbstractAsyncContextManager[Any] | None = None) -> list[Trajectory]:
    """One trajectory of ``sample``: its session's reset, turns until one ends it, the tools' and the
    session's finish (always), the score. Its pieces in order: one, unless the template rewrite rule
    forked it. ``slot`` (a semaphore bounding the trajectories that run at once) is held until the
    tools and the session are finished, not while the trajectory is scored: a slow reward (a judge)
    keeps no other from starting."""
    route = ctx.route_for(sample)
    if route.agent is not None:  # a program runs the episode; the gateway records it
        return await run_agent_trajectory(ctx, route, sample, group, trajectory_id, seed, slot)
    async with slot or contextlib.nullcontext():
        ep = await start_episode(ctx, route, sample, group, trajectory_id, seed)
        traj = ep.traj
        try:
            if ep.session.error is not None:
                raise ep.session.failed()
            await ep.toolset.start()
            ep.toolset.check_infrastructure()  # a tool whose server is down: nothing to train on
            ending = None
            while ending is None:
                ending = await take_turn(ep)
            traj.termination = ending
        except TemplateRewriteError:
            raise  # template_rewrite: refuse stops the run
        except Exception as exc:  # a broken engine/tool/session must not take the other trajectories down
            # toolrl.schemas.InfrastructureError: the environment failed, not the model (not trained).
            traj.termination = "infra_error" if isinstance(exc, InfrastructureError) else "error"
            traj.error = f"{type(exc).__name__}: {exc}"
        finally:
            await finish_tools(ep)
    await scoring.score(route.reward_functions, route.reward_config, traj, sample, ep.step_rewards,
                        extra=ep.session_terms)
    return with_reward(ep.closed, traj)


async def run_agent_trajectory(ctx: RolloutContext, route: Route, sample: Sample, group: int, trajectory_id: str,
                               seed: int, slot: AbstractAsyncContextManager[Any] | None = None) -> list[Trajectory]:
    """One episode of the route's agent program (toolrl.gateway.run), scored as any trajectory: the
    reward functions on its last answer, its step rewards, and the reward the program gave."""
    async with slot or contextlib.nullcontext():
        outcome = await run_agent_episode(ctx, route, sample, group, trajectory_id, seed)
    *closed, traj = outcome.pieces
    await scoring.score(route.reward_functions, route.reward_config, traj, sample, outcome.step_rewards,
                        extra=outcome.terms)
    return with_reward(closed, traj)


def with_reward(closed: Sequence[Trajectory], traj: Trajectory) -> list[Trajectory]:
    """A trajectory's pieces in order, its last ``traj``: every piece is trained with its reward."""
    for piece in closed:
        piece.reward, piece.reward_terms = traj.reward, dict(traj.reward_terms)
        piece.reward_errors = dict(traj.reward_errors)
    return [*closed, traj]


async def start_episode(ctx: RolloutContext, route: Route, sample: Sample, group: int, trajectory_id: str,
                        seed: int) -> _Episode:
    """The session reset (a failed one is kept as the session's error), the trajectory's tools (the
    route's with the session's), its renderer and its prompt. The session is closed if the prompt
    cannot be rendered."""
    session = SessionRun(route.session, trajectory_id)
    try:
        reset = await session.reset(sample)
        try:
            tools = session.tools(reset, route.tools)
        except SessionError as exc:
            session.error, tools = str(exc), route.tools
        renderer = ctx.renderer(route, tools)
        messages, images = prompt_of(renderer, sample, ctx.config.images, reset.messages)
        traj = Trajectory(trajectory_id=trajectory_id, sample_index=sample.index or 0, group=group,
                          env=sample.env, prompt_ids=renderer.prompt_ids(messages, [i.grid_thw for i in images]),
                          images=images, ground_truth=sample.ground_truth)
    except BaseException:
        await asyncio.shield(session.close())
        raise
    toolset = ToolSet(tools, tools_kwargs(route, sample), trajectory_id)
    messages = renderer.prompt_messages(messages)
    return _Episode(ctx.config, ctx.engine, route, renderer, toolset, traj, seed, session,
                    messages=messages, task=len(messages))


def tools_kwargs(route: Route, sample: Sample) -> dict[str, ToolKwargs]:
    """The sample's per-tool arguments; a tool that reads the prompt's images (a class attribute
    ``takes_sample_images = True``, e.g. one that crops a figure) gets them as ``create_kwargs.images``
    (PNG bytes, toolrl.images), so datasets need not copy them into every row's tools_kwargs."""
    out = dict(sample.tools_kwargs)
    for name, tool in route.tools.items():
        if getattr(tool, "takes_sample_images", False):
            kwargs = out.get(name) or ToolKwargs()
            out[name] = kwargs.model_copy(update={"create_kwargs": {"images": list(sample.images),
                                                                    **kwargs.create_kwargs}})
    return out


@dataclass
class _Episode:
    """One trajectory in progress: what its turns read (config, engine, route, renderer, tools, seed,
    session) and what they write (the trajectory, the tools' step rewards, the session's terms)."""

    config: RolloutConfig
    engine: RolloutEngine
    route: Route
    renderer: ChatRenderer
    toolset: ToolSet
    traj: Trajectory
    seed: int
    session: SessionRun
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation, for history checks
    step_rewards: list[float] = field(default_factory=list)
    session_terms: dict[str, float] = field(default_factory=dict)  # the session's score, as reward terms
    closed: list[Trajectory] = field(default_factory=list)  # pieces closed by forks, context edits, branches
    task: int = 0  # the first messages, the task: every context policy keeps them
    # A branch (fold): the response tokens of the lines waiting on it, and its own engine session.
    outer: int = 0
    engine_session: str = ""

    @property
    def response_tokens(self) -> int:
        """Response tokens of the whole trajectory (every piece's)."""
        return self.outer + sum(len(p.response_ids) for p in self.closed) + len(self.traj.response_ids)

    @property
    def context_tokens(self) -> int:
        """The live segment's tokens: what the next generation reads."""
        return len(self.traj.prompt_ids) + len(self.traj.response_ids)

    @property
    def context_room(self) -> int:
        """Tokens the live context may still take under ``model.max_context`` (the route's policy's)."""
        cap = self.route.context.max_context if self.route.context is not None else None
        return cap - self.context_tokens if cap is not None else 1 << 62


async def take_turn(ep: _Episode) -> Termination | None:
    """One turn: generate, parse, run the calls, append their results. Returns why the trajectory
    ends here, or None to take another turn."""
    cfg, traj = ep.config, ep.traj
    budget = cfg.max_response_tokens - ep.response_tokens
    if budget <= 0:
        return "max_response_tokens"
    if ep.context_room <= 0:
        return "length"
    gen = await generate(ep, min(budget, ep.context_room))
    calls, errors = await parse(ep, gen)
    ending = ending_after_generation(ep, gen, calls, errors)
    if ending == "answered":
        if ep.engine_session:  # a branch (fold): its answer goes back to the line that called it, not to the session
            traj.final_response = await answer_of(ep, gen)
            return "answered"
        return await user_turn(ep, gen) or await fit_context(ep)
    if ending is not None:
        return ending
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


async def fit_context(ep: _Episode) -> Termination | None:
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
    end = model_tokens_end(traj.response_mask)
    cut_response(traj, end)
    traj.images = images_in(ep.renderer, traj.images, traj.prompt_ids + traj.response_ids)
    return "length"


async def edit_context(ep: _Episode, policy: ContextPolicy, plan: ContextPlan) -> Termination | None:
    """Close the live segment and continue from the edited conversation, rendered by the template, as
    a new segment. A plan that asks the model first (a summary) gets the request as a user turn
    (mask 0) and the reply as a generated turn (mask 1, trained in the segment it closes)."""
    traj, messages, summary = ep.traj, plan.messages, None
    if traj.images or ep.route.parser.result_mode == "inline":
        raise ContextError("context policies edit conversations of chat turns without images: this trajectory "
                           + ("holds images" if traj.images else "calls tools inline"))
    if plan.ask is not None and plan.then is not None:
        ask_model(ep, plan.ask)
        left = ep.config.max_response_tokens - ep.response_tokens
        if left <= 0 or ep.context_room <= 0:
            return "max_response_tokens" if left <= 0 else "length"
        budget = min(left, ep.context_room, plan.max_reply_tokens or ep.config.max_new_tokens)
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


def ask_model(ep: _Episode, request: str) -> None:
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


def branch_of(ep: _Episode, call: ToolCall) -> tuple[ToolCall, Branch] | ToolResult | None:
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


async def run_branch(ep: _Episode, call: ToolCall, branch: Branch) -> ToolResult:
    """Run a sub-task in a branch (fold): a segment of its own (the trajectory's key, reward and
    advantage) whose prompt is the template's rendering of ``branch.messages``, taking turns with the
    trajectory's tools, its own turn limit and an engine session of its own (so the engine keeps the
    main line's KV). Its answer, cut to ``max_result_tokens``, is ``call``'s result; the calling line
    goes on without the branch's turns. The branch is closed (and numbered) when it ends."""
    traj, policy = ep.traj, ep.route.context
    if traj.images or ep.route.parser.result_mode == "inline" or policy is None:
        raise ContextError("context policies edit conversations of chat turns without images: this trajectory "
                           + ("holds images" if traj.images else "calls tools inline"))
    prompt = ep.renderer.conversation_ids(branch.messages)
    record = ContextEdit(policy=policy.name, action="fold", turn=traj.turns, tokens_before=ep.context_tokens,
                         tokens_after=len(prompt), task=branch.task)
    twig = Trajectory(trajectory_id=f"{traj.key}~branch{len(ep.closed)}", trajectory_key=traj.key,
                      sample_index=traj.sample_index, group=traj.group, env=traj.env, prompt_ids=prompt,
                      ground_truth=traj.ground_truth, edit=record)
    sub = _Episode(ep.config, ep.engine, replace(ep.route, max_turns=branch.max_turns), ep.renderer, ep.toolset,
                   twig, branch_seed(ep.seed, len(ep.closed) + 1), ep.session,
                   messages=list(branch.messages), step_rewards=ep.step_rewards, session_terms=ep.session_terms,
                   closed=ep.closed, task=ep.task, outer=ep.outer + len(traj.response_ids),
                   engine_session=twig.trajectory_id)
    try:
        ending = None
        while ending is None:
            ending = await take_turn(sub)
    finally:
        ep.engine.end_session(sub.engine_session)
    answer = ep.renderer.truncate(twig.final_response.strip(), branch.max_result_tokens, "keep_head") \
        if ending == "answered" else f"Error: the branch ended without an answer ({ending})"
    record.result = answer
    end, piece = model_tokens_end(twig.response_mask), len(ep.closed)  # what follows its answer trains nothing
    del twig.response_ids[end:], twig.response_mask[end:], twig.logprobs[end:]
    twig.trajectory_id, twig.piece, twig.termination = f"{traj.key}~{piece}", piece, "forked"
    ep.closed.append(twig)
    traj.trajectory_key, traj.piece = traj.key, piece + 1
    return ToolResult(name=call.name, arguments=call.arguments, response=ToolResponse(text=answer),
                      status="ok" if ending == "answered" else "error")


class ContextError(RuntimeError):
    """A context edit that cannot be made; it ends its trajectory with an error."""


def check_history(ep: _Episode) -> None:
    """Compare the template's rendering of the conversation so far with the trajectory's tokens and
    apply ``rollout.template_rewrite`` (toolrl.rollout.rewrite) when they differ."""
    traj = ep.traj
    if ep.route.parser.result_mode == "inline":  # one assistant turn: nothing is re-rendered
        return
    traj.template_checks += 1
    try:  # gpt-oss's template refuses turns written as raw harmony text
        rendered = ep.renderer.conversation_ids(ep.messages, [i.grid_thw for i in traj.images])
    except Exception as exc:
        traj.template_rewrites += 1
        if ep.config.template_rewrite == "keep":
            return
        raise TemplateError(f"turn {traj.turns}: the chat template cannot re-render the conversation "
                            f"({type(exc).__name__}: {exc})") from None
    live = traj.prompt_ids + traj.response_ids
    position = first_difference(rendered, live)
    if position is None:
        return
    traj.template_rewrites += 1
    if ep.config.template_rewrite == "refuse":
        raise refusal(traj.turns, position, rendered, live, ep.renderer.decode)
    if ep.config.template_rewrite != "keep":
        close_segment(ep, rendered)
        traj.template_forks += 1


def close_segment(ep: _Episode, rendered: list[int]) -> None:
    """Close the live piece after its last model token; the next piece's prompt is ``rendered`` (a
    template fork's re-rendering, or a context edit's)."""
    traj, piece = ep.traj, len(ep.closed)  # pieces are numbered as they close (a branch's among them)
    end = model_tokens_end(traj.response_mask)
    ep.closed.append(Trajectory(
        trajectory_id=f"{traj.key}~{piece}", trajectory_key=traj.key, piece=piece,
        sample_index=traj.sample_index, group=traj.group, env=traj.env, prompt_ids=traj.prompt_ids,
        images=images_in(ep.renderer, traj.images, traj.prompt_ids + traj.response_ids[:end]),
        response_ids=traj.response_ids[:end], response_mask=traj.response_mask[:end], logprobs=traj.logprobs[:end],
        termination="forked", ground_truth=traj.ground_truth, policy_versions=traj.policy_versions,
        prefill_tokens_saved=traj.prefill_tokens_saved, routes=traj.routes, edit=traj.edit))
    traj.trajectory_key, traj.piece = traj.key, piece + 1
    traj.prompt_ids, traj.response_ids, traj.response_mask, traj.logprobs = rendered, [], [], []
    traj.policy_versions, traj.prefill_tokens_saved, traj.routes, traj.edit = [], 0, None, None


async def user_turn(ep: _Episode, gen: Generation) -> Termination | None:
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
    if ep.response_tokens + len(delta) >= ep.config.max_response_tokens:
        return "max_response_tokens"
    ep.messages.append(message)
    append_tokens(traj, delta, [0] * len(delta), [0.0] * len(delta))
    check_history(ep)
    return None


async def answer_of(ep: _Episode, gen: Generation) -> str:
    """The answer ``gen`` holds: its parsed content, without the end-of-turn token."""
    parsed = await parse_within(ep.route.parser, ep.renderer.turn_text(gen.token_ids), ep.config.parser_timeout_s)
    return parsed.content


async def generate(ep: _Episode, budget: int) -> Generation:
    """Generate within the per-call and the whole-response budgets; the model's tokens join the
    response (mask 1, with the engine's logprobs)."""
    cfg, traj = ep.config, ep.traj
    params = SamplingParams(
        temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=min(cfg.max_new_tokens, budget),
        stop_token_ids=ep.renderer.stop_ids, stop_strings=ep.route.parser.stop_strings,
        seed=turn_seed(ep.seed, traj.turns),
    )
    t0 = time.perf_counter()
    # Images go to the engine only when there are some: text-only engines keep their signature.
    images = {"images": list(traj.images)} if traj.images else {}
    gen = (await ep.engine.generate(traj.prompt_ids + traj.response_ids, params, 1,
                                    session_id=ep.engine_session or traj.key, **images))[0]
    traj.generation_s += time.perf_counter() - t0
    traj.policy_versions.append(gen.weight_version)
    traj.prefill_tokens_saved += gen.prefill_tokens_saved
    if gen.routes is not None:  # they cover the whole context the engine ran: this call's replace the last's
        traj.routes = gen.routes
    append_tokens(traj, gen.token_ids, [1] * len(gen.token_ids), gen.logprobs)
    traj.turns += 1
    traj.model_text.append(ep.renderer.decode(gen.token_ids))
    return gen


async def parse(ep: _Episode, gen: Generation) -> tuple[list[ToolCall], list[ParseError]]:
    """The calls to run and the parse errors to report to the model; sets the final answer. Inline
    tags resume inside the same assistant turn, so only a call closed by this generation's stop
    string runs, and the final answer is the turn's model text."""
    parser, traj, renderer = ep.route.parser, ep.traj, ep.renderer
    seconds = ep.config.parser_timeout_s
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


def ending_after_generation(ep: _Episode, gen: Generation, calls: Sequence[ToolCall],
                            errors: Sequence[ParseError]) -> Termination | None:
    """Why the trajectory ends once the model has spoken: it ran out of tokens, or it made no call
    and no malformed one (its answer). None: there are calls to run or errors to report."""
    if gen.finish_reason == "length":
        return "max_response_tokens" if len(ep.traj.response_ids) >= ep.config.max_response_tokens else "length"
    if not calls and not errors:
        return "answered"
    return None


async def execute(ep: _Episode, calls: Sequence[ToolCall]) -> list[ToolResult]:
    """Run the calls concurrently; calls over the per-turn limit are reported, not dropped."""
    limit, traj = ep.config.max_parallel_calls, ep.traj
    run, over = calls[:limit], calls[limit:]
    opened = [branch_of(ep, c) for c in run]  # fold's branch calls are the loop's, run after the tools'
    t0 = time.perf_counter()
    called = iter(await asyncio.gather(*(ep.toolset.call(c) for c, o in zip(run, opened) if o is None)))
    traj.tool_s += time.perf_counter() - t0
    results = []
    for o in opened:
        results.append(next(called) if o is None else o if isinstance(o, ToolResult) else await run_branch(ep, *o))
    results += [_refused(c, limit) for c in over]
    results = [r.model_copy(update={"turn": traj.turns}) for r in results]  # per-turn success (toolrl eval)
    traj.tool_results += results
    ep.step_rewards += [r.step_reward for r in results]
    return results


def tool_results_delta(ep: _Episode, results: Sequence[ToolResult], errors: Sequence[ParseError],
                       call_ids: Sequence[str | None] = ()) -> tuple[list[int], list[TrajectoryImage]]:
    """The tokens that show the model its calls' results and its parse errors: a chat-template tool
    turn, or inline result tags; each response cut to ``tool_response_max_tokens``. With a processor,
    the images the results hold come with them (the second value, in token order). ``call_ids``: the
    results' calls' ids, in order (for templates that pair a result with its call)."""
    cfg, renderer, parser = ep.config, ep.renderer, ep.route.parser
    shown = tool_images(ep, results) if renderer.processor is not None and parser.result_mode == "chat" else []
    texts = [(r.name, renderer.truncate(_precut(r.response.text, cfg.tool_response_max_tokens,
                                                cfg.tool_response_truncation),
                                        cfg.tool_response_max_tokens, cfg.tool_response_truncation))
             for r in results]
    texts += [("error", f"Error: {e.message}") for e in errors]
    if parser.result_mode == "inline":
        return renderer.text_ids("".join(parser.format_inline_result(ToolResponse(text=t)) for _, t in texts)), []
    counts = [len(s) for s in shown] + [0] * (len(texts) - len(shown))
    ids = [*call_ids, *[None] * (len(texts) - len(call_ids))]
    messages = [renderer.tool_message(t, name, n, i) for (name, t), n, i in zip(texts, counts, ids)]
    ep.messages += messages
    images = [image for s in shown for image in s]
    return renderer.tool_delta(messages, [i.grid_thw for i in images]), images


def tool_images(ep: _Episode, results: Sequence[ToolResult]) -> list[list[TrajectoryImage]]:
    """The images each result shows, within ``rollout.images``. A result whose image cannot be shown
    (corrupt, over the pixel cap, over the trajectory's image count) becomes an error result saying
    so, which the model sees instead of its images."""
    limits, held = ep.config.images, len(ep.traj.images)
    shown: list[list[TrajectoryImage]] = []
    for result in results:
        images: list[TrajectoryImage] = []
        try:
            if held + len(result.response.images) > limits.max_per_trajectory:
                raise ImageError(f"{len(result.response.images)} more would exceed the trajectory's limit of "
                                 f"{limits.max_per_trajectory} images (rollout.images.max_per_trajectory)")
            for n, value in enumerate(result.response.images):
                try:
                    images.append(image_for(ep.renderer, value, limits))
                except ImageError as exc:
                    raise ImageError(f"image {n}: {exc}") from None
        except ImageError as exc:
            images = []
            result.status = "error"
            result.response = ToolResponse.error(f"{result.response.text}\nError: the tool's images cannot be "
                                                 f"shown: {exc}".lstrip("\n"))
        else:  # the trajectory holds them once (Trajectory.images), not its tool results too
            result.response = result.response.model_copy(update={"images": []})
        held += len(images)
        shown.append(images)
    return shown


def prompt_of(renderer: ChatRenderer, sample: Sample, limits: ImageLimits,
              opening: Sequence[dict[str, Any]] = ()) -> tuple[list[dict[str, Any]], list[TrajectoryImage]]:
    """``sample``'s prompt messages (then ``opening``, the session's first messages) as the renderer
    renders them, and the images they show: with a processor, each ``<image>`` an image part and each
    image within ``limits``; a text model reads the prompt's text only."""
    messages = [m.to_template() for m in sample.prompt] + [dict(m) for m in opening]
    if not sample.images or renderer.processor is None:
        return messages, []
    images = [image_for(renderer, png, limits) for png in sample.images]
    return renderer.with_image_parts(messages, IMAGE_PLACEHOLDER), images


def image_for(renderer: ChatRenderer, value: Any, limits: ImageLimits) -> TrajectoryImage:
    """An image (any form toolrl.images reads) as a trajectory holds it: PNG within ``limits``, and its
    patch grid."""
    png = prepare(value, limits)
    return TrajectoryImage(png=png, grid_thw=renderer.image_grid(png))


def images_in(renderer: ChatRenderer, images: Sequence[TrajectoryImage], ids: Sequence[int]) -> list[TrajectoryImage]:
    """The first of ``images`` whose runs the token list ``ids`` (a prefix of a trajectory) holds."""
    if renderer.image_token_id is None:
        return []

    return list(images[:images_held(images, ids, renderer.image_token_id, renderer.merge)])


async def finish_tools(ep: _Episode) -> None:
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
    ep.session_terms = await asyncio.shield(ep.session.finish(traj))
    ep.engine.end_session(traj.key)


def _precut(text: str, max_tokens: int, mode: str) -> str:
    """Cut a huge tool response by characters before it is tokenized: tokenizing a megabyte would hold
    the event loop (every trajectory) for seconds, only to keep ``max_tokens`` of it."""
    limit = 32 * max_tokens  # characters: far more than max_tokens tokens of ordinary text
    if len(text) <= limit:
        return text
    note = f"...[{len(text) - limit} characters truncated]..."
    if mode == "keep_head":
        return text[:limit] + "\n" + note
    if mode == "keep_tail":
        return note + "\n" + text[-limit:]
    return text[: limit // 2] + "\n" + note + "\n" + text[-(limit // 2):]


def _refused(call: ToolCall, limit: int) -> ToolResult:
    return ToolResult(name=call.name, arguments=call.arguments, status="error", response=ToolResponse.error(
        f"Error: at most {limit} tool calls run per turn; this call to '{call.name}' was not run. "
        "Make it in your next turn."))


async def _limited(ctx: RolloutContext, limit: asyncio.Semaphore, sample: Sample, group: int, k: int, seed: int,
                   id_prefix: str) -> list[Trajectory]:
    return await run_trajectory_pieces(ctx, sample, group, f"{id_prefix}s{sample.index}-g{group}-{k}",
                                       trajectory_seed(seed, group, k), slot=limit)


async def run_group(ctx: RolloutContext, sample: Sample, group: int, n: int, seed: int, id_prefix: str,
                    limit: asyncio.Semaphore) -> list[Trajectory]:
    """The ``n`` trajectories of one group, concurrent; ``limit`` bounds the trajectories running at
    once across every group that shares it. Seeds and ids are those :func:`run_rollouts` gives."""
    return [p for pieces in await asyncio.gather(*(_limited(ctx, limit, sample, group, k, seed, id_prefix)
                                                   for k in range(n))) for p in pieces]


async def run_rollouts(ctx: RolloutContext, samples: Sequence[Sample], n: int, seed: int,
                       id_prefix: str = "") -> list[Trajectory]:
    """``n`` trajectories per sample (group ``g`` is sample ``g``), all concurrent (bounded by
    max_concurrent_trajectories)."""
    limit = asyncio.Semaphore(ctx.config.max_concurrent_trajectories)
    jobs = [_limited(ctx, limit, s, g, k, seed, id_prefix) for g, s in enumerate(samples) for k in range(n)]
    return [p for pieces in await asyncio.gather(*jobs) for p in pieces]
