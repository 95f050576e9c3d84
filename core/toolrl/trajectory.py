"""The trajectory record: everything one trajectory produced, as the rollout loop writes it and the
trainer, packing, the critic, recorded data and traces read it. A data module: it imports no part of
the agent loop, so the training side never imports the loop to read its output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from toolrl.schemas import ParseError, ToolResult

# "forked": a piece closed because the template rewrote history (toolrl.renderers.rewrite), the context
# policy edited the context or a fold branch ended (toolrl.context: the next piece's ``edit`` says how); "done": the
# environment session ended the episode (toolrl.sessions); "infra_error": the infrastructure failed
# (toolrl.schemas.InfrastructureError), so the trajectory is not trained and not in its group's baseline.
Termination = Literal["answered", "max_turns", "max_response_tokens", "length", "error", "forked", "done",
                      "infra_error"]


class ContextEdit(BaseModel):
    """An edit of the context by the context policy (toolrl.context), recorded on the segment it opens."""

    policy: str
    action: str  # what the policy did: drop_tool_outputs, window, summarise, fold, ...
    turn: int  # the turns of the line it was made on (fold: the main line's, when it called its branch)
    removed: list[int] = Field(default_factory=list)  # indices of the messages dropped or replaced
    tokens_before: int  # the live context's tokens before the edit (the summary turn included)
    tokens_after: int  # the new segment's prompt tokens
    summary: str | None = None  # the generated summary (summarise), trained in the segment before
    # fold: the segment is a branch: the sub-task it ran and what it returned to the main line (its answer, cut)
    task: str | None = None
    result: str | None = None


class TrajectoryImage(BaseModel):
    """One image in a trajectory's tokens (from the prompt or a tool result), held once: the trainer
    derives its pixel values with the model's processor, so trajectories stay small on their way to it."""

    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    png: bytes  # the image as the model saw it (after the configured size limits), PNG-encoded
    grid_thw: tuple[int, int, int]  # the processor's patch grid: its placeholder run has t*h*w / merge**2 tokens


class RoutedExperts(BaseModel):
    """The experts a mixture-of-experts engine routed each token to: ``tokens × layers × top_k`` expert
    ids, ``width`` bytes each (one while every id is below 256, else two, little-endian), row-major in
    ``ids``. Token ``k`` is the ``k``-th token the model was run on: prompt and response tokens alike,
    up to the last one fed to the model (the last sampled token never is). Replayed by the trainer
    under ``algorithm.routing_replay: r3``."""

    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    layers: int = Field(gt=0)
    top_k: int = Field(gt=0)
    width: Literal[1, 2] = 1
    ids: bytes

    @property
    def tokens(self) -> int:
        return len(self.ids) // (self.layers * self.top_k * self.width)

    def array(self) -> Any:
        """The ids as a ``(tokens, layers, top_k)`` uint8 (or uint16) numpy array (a view of ``ids``)."""
        import numpy as np  # lazy, as in common_prefix

        dtype = np.uint8 if self.width == 1 else np.dtype("<u2")
        return np.frombuffer(self.ids, dtype=dtype).reshape(self.tokens, self.layers, self.top_k)

    @classmethod
    def of(cls, ids: Any) -> RoutedExperts:
        """From a ``(tokens, layers, top_k)`` array or CPU tensor of expert ids below 65536."""
        import numpy as np

        a = np.asarray(ids)
        if a.ndim != 3 or (a.size and (a.min() < 0 or a.max() > 65535)):
            raise ValueError(f"routed experts must be (tokens, layers, top_k) ids in [0, 65535], got shape {a.shape}")
        if not a.size or a.max() < 256:
            return cls(layers=a.shape[1], top_k=a.shape[2], ids=a.astype(np.uint8).tobytes())
        return cls(layers=a.shape[1], top_k=a.shape[2], width=2, ids=a.astype("<u2").tobytes())


class Trajectory(BaseModel):
    """Everything one trajectory produced; the trainer reads nothing else."""

    trajectory_id: str
    # The whole trajectory's id, shared by its pieces when it forked (a template rewrite, a context edit,
    # a fold branch; ids below); empty: a trajectory in one piece.
    trajectory_key: str = ""
    piece: int = 0
    sample_index: int
    group: int  # trajectories of one prompt share a group (GRPO)
    env: str | None = None  # the sample's environment (its route)
    # The role that sampled this piece's tokens (one per piece: a role change starts a piece, since under
    # model.adapters its context runs through another adapter); None: a run with no roles.
    role: str | None = None
    prompt_ids: list[int]
    # Images in the order of their placeholder runs in prompt_ids + response_ids (never trained).
    images: list[TrajectoryImage] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)  # 1: model token (trained), 0: tool/template
    logprobs: list[float] = Field(default_factory=list)  # engine logprobs; 0.0 where mask is 0
    # On-policy distillation: the teacher's log-prob of each response token (0.0 where mask is 0); None
    # until a teacher scored it (toolrl.rollout.teacher).
    teacher_logprobs: list[float] | None = None
    # With opd's top_k: at each response position the teacher's top_k likeliest tokens and their log-probs,
    # best first ([] where mask is 0); None otherwise.
    teacher_top_ids: list[list[int]] | None = None
    teacher_top_logprobs: list[list[float]] | None = None
    turns: int = 0
    final_response: str = ""
    model_text: list[str] = Field(default_factory=list)  # each generation's text
    tool_results: list[ToolResult] = Field(default_factory=list)
    parse_errors: list[ParseError] = Field(default_factory=list)
    termination: Termination = "answered"
    error: str | None = None
    reward: float = 0.0
    reward_terms: dict[str, float] = Field(default_factory=dict)
    # Reward functions that failed (raised, timed out, gave no number), by name: their term is 0, not a score.
    reward_errors: dict[str, str] = Field(default_factory=dict)
    # Rewards given to one role (a program's {"reward": x, "role": r}); a role absent here gets ``reward``.
    role_rewards: dict[str, float] = Field(default_factory=dict)
    tool_rewards: dict[str, float] = Field(default_factory=dict)
    tool_errors: dict[str, str] = Field(default_factory=dict)  # create/calc_reward/release failures, by tool
    reward_parts: dict[str, float] = Field(default_factory=dict)  # "tool.part": what a calc_reward was made of
    user_turns: list[str] = Field(default_factory=list)  # the session's user turns (respond), in order
    loop_blocked_s: float = 0.0  # seconds tool code held the event loop (see toolrl.tools.guard)
    ground_truth: Any = None
    generation_s: float = 0.0
    tool_s: float = 0.0
    # The engine's weight version for each generation call (trainer steps applied to the weights
    # that sampled its first token); more than one value: the weights changed mid-trajectory.
    policy_versions: list[int] = Field(default_factory=list)
    # The engine's expert choice for each token it ran (a mixture-of-experts model whose engine records
    # them: engine.options.record_routes); None otherwise. Saved as "routes", the name files hold it by.
    routed_experts: RoutedExperts | None = Field(None, validation_alias=AliasChoices("routed_experts", "routes"))
    # Prompt tokens the engine did not prefill for this piece's generations (Generation.prefill_tokens_saved).
    prefill_tokens_saved: int = 0
    # Template history checks (one per round of tool results), rewrites found, and forks made; whole
    # trajectory counts, kept on its last piece.
    template_checks: int = 0
    template_rewrites: int = 0
    template_forks: int = 0
    # The context edit that opened this segment (None: the first segment of the main line, or a fork).
    edit: ContextEdit | None = None
    # Per model turn of this piece: where its tokens start in response_ids, and the key of the state it
    # started from (toolrl.rollout.turns): turn-level estimators (gigpo) group turns by it.
    turn_starts: list[int] = Field(default_factory=list)
    turn_states: list[str] = Field(default_factory=list)
    # Tree rollouts (rollout.tree): the tree of its group this trajectory is a leaf of (None: a flat
    # rollout), and where it left the line it split from (response tokens before it are shared).
    tree_id: int | None = None
    split_point: int | None = Field(None, validation_alias=AliasChoices("split_point", "branch_point"))  # its old name

    @property
    def key(self) -> str:
        return self.trajectory_key or self.trajectory_id

    @model_serializer(mode="wrap")
    def _saved_names(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The fields as files hold them: ``routed_experts`` under its saved name, ``routes``."""
        return {("routes" if k == "routed_experts" else k): v for k, v in handler(self).items()}


def rewards_of(traj: Trajectory) -> tuple[float, tuple[tuple[str, float], ...]]:
    """What a group's baseline compares of a trajectory: its reward and each role's (``role_rewards``).
    A group whose trajectories all give the same has zero group-relative advantage: it teaches nothing."""
    return traj.reward, tuple(sorted(traj.role_rewards.items()))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens ``a`` and ``b`` have in common (lists, arrays or CPU tensors of ids).
    The one comparison of token sequences: rollouts find template rewrites with it, the prefix-shared
    micro-batch layout (:mod:`toolrl.training.prefix_tree`) its shared prefixes."""
    import numpy as np  # vectorised: sequences run to tens of thousands of tokens; lazy, as rollout is

    x, y = np.asarray(a[:len(b)], dtype=np.int64), np.asarray(b[:len(a)], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else len(x)


def model_tokens_end(mask: Sequence[int]) -> int:
    """The end of a piece's last model token: what follows (a tool-result delta) trains nothing."""
    return next((i + 1 for i in range(len(mask) - 1, -1, -1) if mask[i]), 0)


def append_tokens(traj: Trajectory, ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float]) -> None:
    """Tokens appended to a trajectory's response, each with its mask and log-prob (0.0 where untrained)."""
    traj.response_ids += ids
    traj.response_mask += mask
    traj.logprobs += logprobs


def cut_response(traj: Trajectory, end: int) -> None:
    """A trajectory's response cut to its first ``end`` tokens (their masks and log-probs with them)."""
    del traj.response_ids[end:], traj.response_mask[end:], traj.logprobs[end:]


# Trajectory ids, made and read here only (docs/rollouts.md): a root ``[prefix]s<sample>-g<group>-<k>``, a tree
# line's path (``.1.0``, ``.r2`` a made-up leaf), then a part (``~<n>`` a closed piece, ``~branch<n>`` a fold
# branch and ``#<n>`` a gateway segment while they run; none: the last piece, whose id is the trajectory's key).
ID_MARKS = {"piece": "~", "branch": "~branch", "segment": "#"}
_ID = re.compile(r"(?P<root>[^.~#]+)(?P<path>(?:\.r?\d+)*)(?P<part>(?:~branch|~|#)\d+)?")


def read_id(tid: str) -> tuple[str, tuple[str, ...], str]:
    """``tid``'s root, tree path and part (its mark and number, ``~3``; empty: none), which make it again."""
    if (m := _ID.fullmatch(tid)) is None:
        raise ValueError(f"not a trajectory id: {tid!r}")
    return m["root"], tuple(m["path"].split(".")[1:]), m["part"] or ""


def call_prefix(kind: str, number: int) -> str:
    return f"{kind}{number}-"  # a rollout call's: t<step> a training step's, e<step> a streamed one's, eval<chunk>


def prefixed_id(prefix: str, tid: str) -> str:
    return prefix + tid  # a recorded trajectory's id, as the rollout call ``prefix`` names returns it


def root_id(prefix: str, sample: int | None, group: int, k: int) -> str:
    return f"{prefix}s{sample}-g{group}-{k}"


def part_id(key: str, part: Literal["piece", "branch", "segment"], index: int) -> str:
    return f"{key}{ID_MARKS[part]}{index}"  # ``key``: a trajectory's, or a tree line's


def line_id(key: str, path: tuple[int, ...]) -> str:
    return read_id(key)[0] + "".join(f".{s}" for s in path)  # the line at ``path`` in the tree of the line ``key``


def made_up_id(key: str, k: int) -> str:
    return f"{key}.r{k}"  # leaf ``k`` made up from the prompt for the tree line ``key``


def moved_id(tid: str, key: str) -> str:
    return key + read_id(tid)[2]  # ``tid`` (a part of one line) as the line ``key`` (its clone) names it
