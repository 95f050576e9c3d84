"""The ``reasoning_gym`` environment: questions from any of reasoning-gym's generators by name, or a
weighted mixture of several, each answered in ``<answer>`` tags and scored by its generator; with
``levels``, one generator at each of several difficulty levels of its reasoning-gym curriculum, which the
environment exposes (``Environment.levels``) for ``data.curriculum: {name: env_difficulty}``.

Splits never share a seed. A generator makes entry ``i`` of a dataset seeded ``s`` from the seed
``s + i``; so each generator's training split is entries ``0..n-1`` of its dataset seeded ``seed``
(seeds ``seed .. seed+n-1``) and its test split is a dataset seeded ``seed + n`` (seeds from
``seed + n`` on); level ``j`` starts at ``seed + j·(size + test_size)``. A sample's ground truth names
its generator, config, seed, size and index, which is how the reward finds the entry to score.
"""

from __future__ import annotations

import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from toolrl.environments import Environment
from toolrl.schemas import Sample

from toolrl_reasoning_gym.generators import check_config, check_name, level_configs, make, names

INSTRUCTIONS = "Give your final answer inside <answer></answer> tags."
CALCULATOR = ("You may call the calculator tool for arithmetic. " + INSTRUCTIONS)
CALCULATOR_TOOL = {"class_name": "calculator", "config": {"type": "native", "timeout": 5}}


class Part(BaseModel):
    """One generator of a mixture: its share of the samples and its config."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(1.0, gt=0)
    config: dict[str, Any] = Field(default_factory=dict)


class ReasoningGymOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    datasets: dict[str, Part] | None = Field(None, description="a weighted mixture: {generator: {weight, config}}")
    dataset: str = Field("chain_sum", description="the generator (toolrl env show reasoning_gym lists them); "
                         "unused when `datasets` mixes several")
    config: dict[str, Any] = Field(default_factory=dict, description="the generator's own options")
    size: int = Field(512, gt=0, description="training samples")
    test_size: int = Field(64, gt=0)
    seed: int = Field(0, ge=0)
    calculator: bool = Field(False, description="offer the calculator tool (toolrl-plugin-calculator)")
    levels: int | list[dict[str, int]] | None = Field(None, description="difficulty levels of the generator's "
                                                      "reasoning-gym curriculum (data.curriculum env_difficulty "
                                                      "moves through them): n, its first n with every attribute "
                                                      "stepping together, or one {attribute: level} per level; "
                                                      "both splits spread over them")

    @field_validator("dataset")
    @classmethod
    def _known(cls, name: str) -> str:
        return check_name(name)

    @field_validator("datasets")
    @classmethod
    def _known_parts(cls, parts: dict[str, Part] | None) -> dict[str, Part] | None:
        for name, part in (parts or {}).items():
            check_config(check_name(name), part.config)
        return parts

    @field_validator("config")
    @classmethod
    def _config(cls, config: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("datasets") is not None:
            if config:
                raise ValueError("give each generator's config in `datasets` when mixing")
        elif "dataset" in info.data:  # a misspelt name is its own error
            check_config(info.data["dataset"], config)
        return config

    @model_validator(mode="after")
    def _levels(self) -> ReasoningGymOptions:
        if self.levels is not None:
            if self.datasets is not None:
                raise ValueError("levels: the levels of one generator (dataset), not of a mixture")
            level_configs(self.dataset, self.levels, self.config)
        return self

    def parts(self) -> dict[str, Part]:
        return self.datasets or {self.dataset: Part(config=self.config)}

    def units(self) -> list[tuple[str, Part, int | None]]:
        """What the splits are drawn from: each generator of the options (no level), or the generator at
        each of its levels (its config with what the level sets)."""
        if self.levels is None:
            return [(name, part, None) for name, part in self.parts().items()]
        return [(self.dataset, Part(config={**self.config, **config}), j)
                for j, (_, config) in enumerate(level_configs(self.dataset, self.levels, self.config))]


def shares(parts: dict[Any, Part], total: int) -> dict[Any, int]:
    """``total`` split by weight (largest remainders), every generator at least one sample."""
    weights = sum(p.weight for p in parts.values())
    exact = {n: max(1.0, total * p.weight / weights) for n, p in parts.items()}
    counts = {n: int(v) for n, v in exact.items()}
    for name in sorted(exact, key=lambda n: counts[n] - exact[n])[:max(0, total - sum(counts.values()))]:
        counts[name] += 1
    return counts


def tasks(options: ReasoningGymOptions, split: str) -> list[Sample]:
    """``split``'s questions, each with the generator entry it came from as ground truth."""
    if split not in ("train", "test"):
        raise ValueError(f"no split {split!r} (train, test)")
    units = options.units()
    weighted = {u: part for u, (_, part, _) in enumerate(units)}
    train, test = shares(weighted, options.size), shares(weighted, options.test_size)
    rows = []
    for u, (name, part, level) in enumerate(units):
        # Seeds seed..seed+n-1 train, seed+n.. test, each level past the ones before it (module docstring).
        first = options.seed + (level or 0) * (options.size + options.test_size)
        seed, size = (first, train[u]) if split == "train" else (first + train[u], test[u])
        dataset = make(name, _json(part.config), seed, size)
        for index in range(size):
            rows.append((name, part.config, seed, size, index, level, dataset[index]["question"]))
    if len(units) > 1:
        random.Random(f"{options.seed}:{split}").shuffle(rows)
    return [Sample(prompt=[{"role": "user", "content": question}], data_source=f"reasoning_gym/{name}", index=i,
                   level=level, ground_truth={"dataset": name, "config": config, "seed": seed, "size": size,
                                              "index": index})
            for i, (name, config, seed, size, index, level, question) in enumerate(rows)]


def _json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def configure(options: ReasoningGymOptions) -> dict[str, Any]:
    levels = {"levels": [label for label, _ in level_configs(options.dataset, options.levels, options.config)]} \
        if options.levels is not None else {}
    if not options.calculator:
        return levels
    return {"tools": [CALCULATOR_TOOL], "instructions": CALCULATOR, "max_turns": 3, **levels}


REASONING_GYM = Environment(
    name="reasoning_gym",
    description=f"reasoning-gym's {len(names())} procedural generators by name (`dataset`), or a weighted mixture "
                "(`datasets`), each scored by its own score_answer; generators: " + ", ".join(names()),
    splits={"train": tasks, "test": tasks},
    instructions=INSTRUCTIONS,
    rewards=[{"name": "reasoning_gym", "weight": 1.0}],
    parser="hermes",
    max_turns=1,
    metric="reasoning_gym",
    options=ReasoningGymOptions,
    configure=configure,
)
