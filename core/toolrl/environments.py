"""Environments: a task's dataset splits with the prompt, tools, rewards, parser and turn limit that
belong to it, registered by plugins through ``register_environments`` (so an environment ships as
``pip install toolrl-plugin-x``) and selected in a config with ``env: NAME`` or mixed with ``envs:``.

A split is local files (:class:`FileSplit`), a Hugging Face dataset (:class:`HubSplit`) or a generator,
loaded by :func:`toolrl.data.sources.load_split`; per-trajectory state is an environment session
(:mod:`toolrl.sessions`); an options model and ``configure`` adapt an environment to its ``env_options``.
How to write one: docs/environments.md. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolrl.config import Config, ConfigError, RewardTerm, field_where, format_errors, one_line
from toolrl.plugins.parts import BuildContext, UncheckedOptions, build_part, lookup_part
from toolrl.schemas import Message
from toolrl.tools.verl_config import ToolEntry


class FileSplit(BaseModel):
    """Local verl-format files; relative paths resolve against the config's directory."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["files"] = "files"
    files: list[str] = Field(min_length=1)

    def describe(self) -> str:
        return ", ".join(self.files)


class HubSplit(BaseModel):
    """A Hugging Face ``datasets`` dataset: ``datasets.load_dataset(path, name, split=split,
    revision=revision)``. ``path`` is a Hub id or a local dataset directory; offline runs read the
    ``datasets`` cache (``HF_DATASETS_OFFLINE=1``)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["hub"] = "hub"
    path: str
    name: str | None = None
    split: str = "train"
    revision: str | None = None

    def describe(self) -> str:
        config = f" ({self.name})" if self.name else ""
        return f"hub {self.path}{config} split {self.split}"


Generator = Callable[[Any, str], list[Any]]
SplitSource = FileSplit | HubSplit | Generator
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


def is_term(metric: str, terms: Sequence[str], sessions: Sequence[str]) -> bool:
    """Whether ``metric`` names a reward term a trajectory can have: one of ``terms``, or a part of a
    session's score (``session.part``: a score given as parts without a ``reward``,
    :func:`toolrl.rewards.scoring.named_terms`)."""
    return metric in terms or any(metric.startswith(f"{name}.") for name in sessions)


class Environment(BaseModel):
    """One environment. Every field but ``name`` and ``splits`` is optional; a config's explicit
    ``data``, ``tools``, ``reward`` and ``rollout.parser``/``max_turns`` override the environment's."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    splits: dict[str, SplitSource] = Field(min_length=1, description="split name (train, test) -> loader")
    # row(record, options, split) -> a verl row (``prompt``, ``reward_model.ground_truth``,
    # ``extra_info.tools_kwargs``), for the records of Hub splits.
    row: Callable[[dict[str, Any], Any, str], dict[str, Any]] | None = None
    system_prompt: str | None = None
    instructions: str | None = Field(None, description="appended to every prompt's first user message")
    prompt_prefix: list[dict[str, Any]] = Field(default_factory=list, description="few-shot messages")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="verl tool-config entries")
    session: str | None = Field(None, description="the environment session kind (toolrl.sessions) each "
                                "trajectory runs with: its tools, user turns, done and score")
    session_options: dict[str, Any] = Field(default_factory=dict, description="the session kind's options")
    rewards: list[RewardTerm] = Field(default_factory=list)
    parser: str = "hermes"
    parser_options: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(None, gt=0)
    context: dict[str, Any] | None = Field(None, description="the context policy ({name, ...options}, "
                                           "toolrl.context) when rollout.context is unset")
    metric: str | None = Field(None, description="the reward term that decides success (toolrl eval)")
    levels: list[str] = Field(default_factory=list, description="difficulty levels, easiest first (names): each "
                              "training sample's level indexes them (data.curriculum env_difficulty); none: no levels")
    images: bool = Field(True, description="a vision-language policy sees the samples' images; false: every "
                         "policy reads their text, each image as <image>")
    sized: bool = Field(True, description="``toolrl env list`` counts its generated splits; false where making "
                        "them is slow (TextWorld compiles games): listed unsized, counted by ``env show``")
    options: type[BaseModel] | None = None
    configure: Callable[[Any], dict[str, Any]] | None = None
    # rows -> {figure: number}: the environment's own figures from its evaluated trajectories (the rows of
    # results.jsonl whose samples are its), as its benchmark reports them; toolrl eval adds them to summary.json
    # under reports.NAME and prints them.
    report: Callable[[list[dict[str, Any]]], dict[str, float | None]] | None = None

    @field_validator("prompt_prefix")
    @classmethod
    def _messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for message in value:
            Message.model_validate(message)
        return value

    @field_validator("tools")
    @classmethod
    def _tool_entries(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for entry in value:
            ToolEntry.model_validate(entry)  # verl's layout: class_name, config, tool_schema, extras
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Environment:
        terms = [r.name for r in self.rewards] + ([self.session] if self.session else [])
        if self.metric is not None and not is_term(self.metric, terms, [self.session] if self.session else []):
            raise ValueError(f"metric {self.metric!r} is not one of its reward terms (its rewards' and its "
                             f"session's: {', '.join(terms) or 'none'})")
        if any(isinstance(s, HubSplit) for s in self.splits.values()) and self.row is None:
            raise ValueError("a HubSplit needs a row function (dataset row -> verl row)")
        return self

    # -- options ---------------------------------------------------------------------------------

    def resolve(self, options: dict[str, Any], where: str = "env_options", config: Config | None = None,
                field: str = "") -> tuple[Environment, Any]:
        """This environment adapted to ``options`` (validated against its options model), and the
        validated options. A bad option is a ConfigError naming ``where`` and the field, or, given the
        run's ``config`` and the options' dotted ``field``, the option's own line (or override)."""
        if self.options is None:
            if options:
                raise ConfigError(f"{where}: environment {self.name!r} takes no options (got {', '.join(options)})")
            validated: Any = None
        else:
            try:
                validated = self.options.model_validate(options)
            except ValidationError as exc:
                if config is not None and field:
                    raise ConfigError(format_errors(exc, field, self.options, lambda loc: field_where(config, loc))) \
                        from None
                raise ConfigError(f"{where}: {format_errors(exc, model=self.options)}") from None
        if self.configure is None:
            return self, validated
        try:
            changes = self.configure(validated)
            env = Environment.model_validate({**dict(self), **changes, "configure": None})
        except ValidationError as exc:
            raise ConfigError(f"{where}: environment {self.name!r}: {format_errors(exc)}") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: environment {self.name!r}: {one_line(str(exc))}") from None
        return env, validated

    # -- the build contract (toolrl.plugins.parts) -----------------------------------------------

    @property
    def Options(self) -> type[BaseModel]:  # noqa: N802 (the contract's name)
        """Options pass to :meth:`resolve`, which checks them against ``options`` and names the field."""
        return UncheckedOptions

    def build(self, options: BaseModel, context: Any) -> ConfiguredEnv:
        """This environment as a run uses it: adapted to its options (:meth:`resolve`), with the mixture
        weight and turn limit ``context.inputs`` give (1 and None by default)."""
        env, validated = self.resolve(options.model_dump(), context.options_where or "env_options", context.config,
                                      context.options_field)
        return ConfiguredEnv(env, validated, context.inputs.get("weight", 1.0), context.inputs.get("max_turns"))

    def summary(self) -> dict[str, Any]:
        """Name, description, splits (with their sources), tools, rewards, parser, limits: for
        ``toolrl env list/show``."""
        return {
            "name": self.name, "description": self.description,
            "splits": {n: s.describe() if isinstance(s, (FileSplit, HubSplit)) else "generated"
                       for n, s in self.splits.items()},
            "tools": [str(t.get("class_name", "?")) for t in self.tools],
            "session": self.session,
            "rewards": {r.name: r.weight for r in self.rewards},
            "parser": self.parser, "max_turns": self.max_turns, "metric": self.metric, "images": self.images,
            "levels": self.levels,
            "options": self.options.model_json_schema() if self.options is not None else None,
        }


def get_environment(name: str, where: str = "env") -> Environment:
    """The registered environment ``name``; a ConfigError listing the installed ones otherwise."""
    return lookup_part("environments", name, where)


@dataclass(frozen=True)
class ConfiguredEnv:
    """An environment as a config uses it: adapted to its options, with its mixture weight and turn limit."""

    env: Environment
    options: Any
    weight: float
    max_turns: int | None


def configured_envs(config: Config) -> dict[str, ConfiguredEnv]:
    """``env``/``envs`` resolved: each name looked up (unknown names list the installed ones) and its
    options validated against the environment's options model."""
    out = {}
    for name, entry in config.env_entries().items():
        where = ("env", "env_options") if config.env is not None else (f"envs.{name}", f"envs.{name}.options")
        context = BuildContext(*(field_where(config, w) for w in where), config,
                               {"weight": entry.weight, "max_turns": entry.max_turns}, options_field=where[1])
        out[name] = build_part("environments", name, entry.options, context)
    return out
