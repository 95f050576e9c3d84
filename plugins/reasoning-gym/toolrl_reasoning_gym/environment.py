"""The ``reasoning_gym`` environment: questions from any of reasoning-gym's generators by name, or a
weighted mixture of several, each answered in ``<answer>`` tags and scored by its generator.

Splits never share a seed. A generator makes entry ``i`` of a dataset seeded ``s`` from the seed
``s + i``; so each generator's training split is entries ``0..n-1`` of its dataset seeded ``seed``
(seeds ``seed .. seed+n-1``) and its test split is a dataset seeded ``seed + n`` (seeds from
``seed + n`` on). A sample's ground truth names its generator, config, seed, size and index, which
is how the reward finds the entry to score.
"""

from __future__ import annotations

import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from toolrl.environments import Environment
from toolrl.schemas import Sample

from toolrl_reasoning_gym.generators import check_config, check_name, make, names

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

    def parts(self) -> dict[str, Part]:
        return self.datasets or {self.dataset: Part(config=self.config)}


def shares(parts: dict[str, Part], total: int) -> dict[str, int]:
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
    parts = options.parts()
    train, test = shares(parts, options.size), shares(parts, options.test_size)
    rows = []
    for name, part in parts.items():
        # Seeds seed..seed+n-1 train, seed+n.. test (module docstring).
        seed, size = (options.seed, train[name]) if split == "train" else (options.seed + train[name], test[name])
        dataset = make(name, _json(part.config), seed, size)
        for index in range(size):
            rows.append((name, part.config, seed, size, index, dataset[index]["question"]))
    if len(parts) > 1:
        random.Random(f"{options.seed}:{split}").shuffle(rows)
    return [Sample(prompt=[{"role": "user", "content": question}], data_source=f"reasoning_gym/{name}", index=i,
                   ground_truth={"dataset": name, "config": config, "seed": seed, "size": size, "index": index})
            for i, (name, config, seed, size, index, question) in enumerate(rows)]


def _json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def configure(options: ReasoningGymOptions) -> dict[str, Any]:
    if not options.calculator:
        return {}
    return {"tools": [CALCULATOR_TOOL], "instructions": CALCULATOR, "max_turns": 3}


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
