"""Where a run's samples come from: the configured environments' splits (local files, a Hugging Face
dataset, a generator) or ``data.<split>_files``, each sample decorated with its environment's system
prompt, few-shot prefix and instructions, and mixtures drawn by weight. Every problem is a one-line
:class:`~toolrl.config.ConfigError` naming the file, row or field."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from toolrl.config import Config, ConfigError, one_line, resolve_path
from toolrl.data import load_files, origin_of, to_sample
from toolrl.environments import ConfiguredEnv, Environment, FileSplit, HubSplit, configured_envs
from toolrl.images import IMAGE_PLACEHOLDER, is_image_part
from toolrl.schemas import Message, Sample


def load_samples(config: Config, split: str = "train", envs: dict[str, ConfiguredEnv] | None = None) -> list[Sample]:
    """The samples of ``split``: ``"train"`` (training) or ``"test"`` (the held-out split, evaluation).

    ``data.<split>_files`` when set, else the configured environments' splits. A mixture's training
    samples hold each environment's samples in proportion to its weight (repeated when its share
    exceeds its split); its test split is every environment's test samples. ``envs``: the
    configured environments, when already resolved."""
    if split not in ("train", "test"):
        raise ConfigError(f"unknown data split {split!r} (use train or test)")
    envs = configured_envs(config) if envs is None else envs
    files = config.data.train_files if split == "train" else config.data.test_files
    if files:
        samples = load_files([resolve_path(config, f) for f in files], f"data.{split}_files")
        for s in samples:
            _check_route(s, envs)
            decorate(s, config.data.system_prompt, config.data.prompt_prefix or [])
        return samples
    if not envs:
        raise ConfigError(f"data.{split}_files: no {split} split configured (set env or data.{split}_files)")
    parts = {}
    for name, c in envs.items():
        parts[name] = load_split(c.env, split, c.options, config.base_dir)
        system_prompt = config.data.system_prompt or c.env.system_prompt
        prefix = c.env.prompt_prefix if config.data.prompt_prefix is None else config.data.prompt_prefix
        for s in parts[name]:
            decorate(s, system_prompt, prefix, c.env.instructions)
    if len(parts) == 1:
        return next(iter(parts.values()))
    if split == "train":
        return _mix(parts, {n: c.weight for n, c in envs.items()}, config.trainer.seed)
    samples = [s for part in parts.values() for s in part]
    for i, s in enumerate(samples):
        s.index = i  # unique across the environments: trajectory ids and traces use it
    return samples


def _check_route(sample: Sample, envs: dict[str, ConfiguredEnv]) -> None:
    origin = origin_of(sample, "a sample")
    if sample.env is not None and sample.env not in envs:
        raise ConfigError(f"{origin}: extra_info.env: environment {sample.env!r} is not configured "
                          f"(configured: {', '.join(envs) or 'none'})")
    if sample.env is None and len(envs) > 1:
        raise ConfigError(f"{origin}: extra_info.env: a mixture needs each sample's environment "
                          f"(one of {', '.join(envs)})")


def _mix(parts: dict[str, list[Sample]], weights: dict[str, float], seed: int) -> list[Sample]:
    """As many samples as the parts hold together, each environment's share by weight, shuffled."""
    rng = random.Random(seed)
    total, weight_sum = sum(len(p) for p in parts.values()), sum(weights.values())
    mixed: list[Sample] = []
    for name, part in parts.items():
        order = list(part)
        rng.shuffle(order)
        share = max(1, round(total * weights[name] / weight_sum))
        mixed += [order[i % len(order)].model_copy(deep=True) for i in range(share)]
    rng.shuffle(mixed)
    for i, s in enumerate(mixed):
        s.index = i
    return mixed


def text_only(sample: Sample) -> None:
    """Drop ``sample``'s images: each image part of its prompt becomes ``<image>`` in its text, as verl's
    rows write it and a text model reads it."""
    sample.images = []
    for message in sample.prompt:
        if isinstance(message.content, list):
            message.content = "".join(IMAGE_PLACEHOLDER if is_image_part(p) else str(p.get("text", ""))
                                      for p in message.content)


def decorate(sample: Sample, system_prompt: str | None, prefix: list[dict[str, Any]],
             instructions: str | None = None) -> None:
    """Put ``instructions`` at the end of the first user message, the few-shot ``prefix`` after the
    system message, and ``system_prompt`` first unless the sample has its own."""
    head = 1 if sample.prompt and sample.prompt[0].role == "system" else 0
    if instructions:
        user = next((m for m in sample.prompt[head:] if m.role == "user"), None)
        if user is not None and isinstance(user.content, str):
            user.content = f"{user.content} {instructions}".strip()
    sample.prompt[head:head] = [Message.model_validate(m) for m in prefix]
    if system_prompt and not head:
        sample.prompt.insert(0, Message(role="system", content=system_prompt))


def _sample(value: Any, origin: str) -> Sample:
    return value if isinstance(value, Sample) else to_sample(value, origin)


def load_split(env: Environment, split: str, options: Any = None, base_dir: str | Path = ".") -> list[Sample]:
    """The samples of ``env``'s ``split``, each routed to that environment (``Sample.env``); prompts as the
    split holds them (:func:`decorate` adds the system prompt, few-shot prefix and instructions)."""
    if split not in env.splits:
        raise ConfigError(f"environment {env.name!r} has no {split!r} split (splits: {', '.join(env.splits)})")
    source = env.splits[split]
    where = f"environment {env.name!r} split {split!r}"
    if isinstance(source, FileSplit):
        base = Path(base_dir)
        paths = [p if p.is_absolute() else base / p for p in (Path(f).expanduser() for f in source.files)]
        samples = load_files(paths, where)
    elif isinstance(source, HubSplit):
        samples = _load_hub(env, source, options, split, where)
    else:
        try:
            produced = source(options, split)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {one_line(str(exc))}") from None
        samples = [_sample(s, f"{where} sample {i}") for i, s in enumerate(produced, 1)]
    if not samples:
        raise ConfigError(f"{where}: no samples")
    for i, s in enumerate(samples):
        s.env = env.name
        if s.index is None:
            s.index = i
        if not env.images:
            text_only(s)
    return samples

def _load_hub(env: Environment, source: HubSplit, options: Any, split: str, where: str) -> list[Sample]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{where}: reading {source.path} needs the datasets package "
                          "(pip install 'toolrl[datasets]')") from None
    try:
        rows = datasets.load_dataset(source.path, source.name, split=source.split, revision=source.revision)
    except Exception as exc:  # datasets raises many kinds (missing files, offline, bad config)
        raise ConfigError(f"{where}: cannot load {source.describe()}: {one_line(str(exc))}") from None
    assert env.row is not None  # checked by the Environment model
    samples = []
    for n, record in enumerate(rows, 1):
        origin = f"{source.path} {source.split} row {n}"
        try:
            mapped = env.row(dict(record), options, split)
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(f"{origin}: {one_line(str(exc))}") from None
        samples.append(_sample(mapped, origin))
    return samples
