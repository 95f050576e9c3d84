"""A line of a trajectory in progress (:class:`Episode`; its ``line``: :class:`MainLine`, :class:`FoldBranch`
or :class:`TreeLine`): how it starts (the session's reset, its tools, its prompt and images), and the
model's part of a turn (:func:`generate`, :func:`answer_of`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.agent_roles import adapter_keyword, first_role
from toolrl.engines import Generation, SamplingParams
from toolrl.images import IMAGE_PLACEHOLDER, ImageLimits, images_held, prepare
from toolrl.parsers import ToolParser, parse_within
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout.rollout_context import RolloutContext, Route
from toolrl.rollout.turns import record_turn
from toolrl.schemas import Sample, ToolKwargs
from toolrl.seeds import turn_seed
from toolrl.sessions import SessionError, SessionRun
from toolrl.tools import ToolSet
from toolrl.trajectory import Trajectory, TrajectoryImage, append_tokens


@dataclass(frozen=True)
class MainLine:
    """A trajectory's own line (a flat rollout's only one)."""


@dataclass(frozen=True)
class FoldBranch:
    """A fold sub-task (toolrl.rollout.branches), adding to its caller's pieces, step rewards and terms."""

    outer: int  # the response tokens of the lines waiting on it


class Tree(list["asyncio.Task[Episode]"]):
    """A tree rollout's clones, each run as a task (toolrl.rollout.tree): what its lines share."""


@dataclass(frozen=True)
class TreeLine:
    """A tree rollout's line: its tree, its continuation at each split so far (0: it went on as the line)."""

    tree: Tree
    path: tuple[int, ...] = ()


@dataclass
class Episode:
    """One line of a trajectory in progress: what its turns read (the rollout context, route, renderer,
    tools, seed, session) and write (the trajectory, the tools' step rewards, the session's terms)."""

    ctx: RolloutContext
    route: Route
    renderer: ChatRenderer
    toolset: ToolSet
    traj: Trajectory
    seed: int
    session: SessionRun
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation, for history checks
    step_rewards: list[float] = field(default_factory=list)
    session_terms: dict[str, float] = field(default_factory=dict)  # the session's score, as reward terms
    closed: list[Trajectory] = field(default_factory=list)  # the pieces closed so far (toolrl.rollout.segments)
    task: int = 0  # the first messages, the task: every context policy keeps them
    line: MainLine | FoldBranch | TreeLine = MainLine()
    # The parser of its calls: the route's, or a copy bound to the tools its session handed out.
    parser: ToolParser | None = None

    def __post_init__(self) -> None:
        self.parser = self.parser or self.route.parser

    @property
    def response_tokens(self) -> int:
        """Response tokens of the whole trajectory (every piece's, a fold branch's callers' included)."""
        outer = self.line.outer if isinstance(self.line, FoldBranch) else 0
        return outer + sum(len(p.response_ids) for p in self.closed) + len(self.traj.response_ids)

    @property
    def context_tokens(self) -> int:
        """The live segment's tokens: what the next generation reads."""
        return len(self.traj.prompt_ids) + len(self.traj.response_ids)

    @property
    def context_room(self) -> int:
        """Tokens the live context may still take under ``model.max_context`` (the route's policy's)."""
        cap = self.route.context.max_context if self.route.context is not None else None
        return cap - self.context_tokens if cap is not None else 1 << 62


async def start_episode(ctx: RolloutContext, route: Route, sample: Sample, group: int, trajectory_id: str,
                        seed: int) -> Episode:
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
        renderer = ctx.renderer(route, tools if reset.render_tools else {})
        messages, images = prompt_of(renderer, sample, ctx.config.images, reset.messages)
        traj = Trajectory(trajectory_id=trajectory_id, sample_index=sample.index or 0, group=group,
                          env=sample.env, prompt_ids=renderer.prompt_ids(messages, [i.grid_thw for i in images]),
                          images=images, ground_truth=sample.ground_truth,
                          role=first_role(sample, ctx.roles))
    except BaseException:
        await asyncio.shield(session.close())
        raise
    toolset = ToolSet(tools, tools_kwargs(route, sample), trajectory_id)
    messages = renderer.prompt_messages(messages)
    parser = route.parser.for_tools(toolset.schemas()) if reset.tools else route.parser
    return Episode(ctx, route, renderer, toolset, traj, seed, session, messages=messages, task=len(messages),
                   parser=parser)


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


async def generate(ep: Episode, budget: int) -> Generation:
    """Generate within the per-call and the whole-response budgets; the model's tokens join the
    response (mask 1, with the engine's logprobs)."""
    cfg, traj = ep.ctx.config, ep.traj
    params = SamplingParams(
        temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=min(cfg.max_new_tokens, budget),
        stop_token_ids=ep.renderer.stop_ids, stop_strings=ep.parser.stop_strings,
        seed=turn_seed(ep.seed, traj.turns),
    )
    t0 = time.perf_counter()
    # Images go to the engine only when there are some: text-only engines keep their signature.
    images = {"images": list(traj.images)} if traj.images else {}
    gen = (await ep.ctx.engine.generate(traj.prompt_ids + traj.response_ids, params, 1, session_id=traj.trajectory_id,
                                        **images, **adapter_keyword(traj.role, ep.ctx.adapters)))[0]  # a fold branch's is its own
    traj.generation_s += time.perf_counter() - t0
    traj.policy_versions.append(gen.weight_version)
    traj.prefill_tokens_saved += gen.prefill_tokens_saved
    if gen.routed_experts is not None:  # they cover the whole context the engine ran: this call's replace the last's
        traj.routed_experts = gen.routed_experts
    await record_turn(traj, ep.session if ep.ctx.state_keys else None)
    append_tokens(traj, gen.token_ids, [1] * len(gen.token_ids), gen.logprobs)
    traj.turns += 1
    traj.model_text.append(ep.renderer.decode(gen.token_ids))
    return gen


async def answer_of(ep: Episode, gen: Generation) -> str:
    """The answer ``gen`` holds: its parsed content, without the end-of-turn token."""
    return (await parse_within(ep.parser, ep.renderer.turn_text(gen.token_ids),
                               ep.ctx.config.parser_timeout_s)).content


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
