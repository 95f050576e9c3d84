"""reasoning-gym's generators by name: the names it registers, a config checked against the
generator's own dataclass (a misspelt name or field is one line with the closest match), the options
each level of its curriculum sets (:func:`level_configs`), and the entry a task's ground truth names,
generated again to be scored."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from typing import Any

from toolrl_reasoning_gym.sat import INSTALL, NEEDS_PYCOSAT, missing, stand_in

# reasoning_gym imports pycosat with the package: a missing one is stood in for first. The plugin's
# modules import reasoning_gym through this one (the reward its extract_answer).
stand_in()

import reasoning_gym  # noqa: E402
from reasoning_gym.coaching.attributes import RangeAttributeDefinition  # noqa: E402
from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode  # noqa: E402
from reasoning_gym.dataset import ProceduralDataset  # noqa: E402
from reasoning_gym.factory import CURRICULA, DATASETS  # noqa: E402
from reasoning_gym.utils import extract_answer as extract_answer  # noqa: E402

# Set by the environment on every dataset it makes: what a split's range of seeds and its length are.
MANAGED = ("seed", "size")


def names() -> list[str]:
    """The generators reasoning-gym registers (its mixture ``composite`` aside: the options mix)."""
    return sorted(n for n in DATASETS if n != "composite")


def _closest(word: str, among: list[str]) -> str:
    match = difflib.get_close_matches(word, among, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_name(name: str) -> str:
    if name not in names():
        raise ValueError(f"reasoning-gym has no generator {name!r}{_closest(name, names())}")
    if name in NEEDS_PYCOSAT and missing():
        raise ValueError(f"reasoning-gym's {name} needs pycosat, which is not installed: {INSTALL}")
    return name


def check_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as the generator's config dataclass takes it: each key one of its fields (not
    ``seed``/``size``, which the splits set), the values as its own ``validate`` accepts them."""
    fields = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in MANAGED]
    for key in config:
        if key in MANAGED:
            raise ValueError(f"{name}: {key!r} is set by the environment's options (size, test_size, seed)")
        if key not in fields:
            raise ValueError(f"{name} has no option {key!r}{_closest(key, fields)} (its options: {', '.join(fields)})")
    try:
        make(name, json.dumps(config, sort_keys=True), 0, 1)
    except Exception as exc:  # the generator's own checks: assertions, ValueErrors, TypeErrors
        raise ValueError(f"{name}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
    return config


def level_configs(name: str, levels: int | list[dict[str, int]], config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each difficulty level of generator ``name`` from its reasoning-gym curriculum (attributes with levels:
    chain_sum's number of terms and digits): the level's name and the options it sets, a range attribute
    at its level's value alone (the generator's own interval where it keeps one). ``levels``: n, the first n
    levels with every attribute stepping together (each held at its last), or one ``{attribute: level}`` per
    level (an attribute left out at its first). ``config`` may not set what the levels set."""
    if name not in CURRICULA:
        raise ValueError(f"levels: reasoning-gym has no curriculum for {name}")
    attributes = CURRICULA[name]().attributes
    if isinstance(levels, int):
        most = max(len(a.levels) for a in attributes.values())
        if not 1 <= levels <= most:
            raise ValueError(f"levels: {name}'s curriculum has 1 to {most} levels, not {levels}")
        levels = [{a: min(i, len(attr.levels) - 1) for a, attr in attributes.items()} for i in range(levels)]
    out = []
    for i, chosen in enumerate(levels):
        curriculum = CURRICULA[name]()
        for attr, level in chosen.items():
            if attr not in attributes:
                raise ValueError(f"levels.{i}: {name}'s curriculum has no attribute {attr!r}{_closest(attr, list(attributes))} "
                                 f"(its attributes: {', '.join(attributes)})")
            if not 0 <= level < len(attributes[attr].levels):
                raise ValueError(f"levels.{i}.{attr}: level {level}, but {attr} has levels 0-{len(attributes[attr].levels) - 1}")
            curriculum.set_attr_level(attr, level)
        made = curriculum.generate_configuration({"seed": 0, "size": 1}, DefaultCurriculumContext(RangeAttributeMode.UPPER_BOUND))
        fields = [f for a in attributes.values() for f in ((a.lower_field_name, a.upper_field_name)
                                                          if isinstance(a, RangeAttributeDefinition) else (a.field_name,))]
        if clash := [f for f in fields if f in config]:
            raise ValueError(f"config: {clash[0]!r} is set by the levels (drop it from config)")
        label = ",".join(f"{a}={curriculum.get_attr_value(a)}" for a in attributes)
        out.append((label, {f: getattr(made, f) for f in fields}))
    return out


@functools.lru_cache(maxsize=64)
def make(name: str, config_json: str, seed: int, size: int) -> ProceduralDataset:
    """The generator's dataset (cached: a reward regenerates entries of the few a run uses)."""
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def entry(task: dict[str, Any]) -> tuple[ProceduralDataset, dict[str, Any]]:
    """The dataset and entry a sample's ground truth names (``dataset``, ``config``, ``seed``,
    ``size``, ``index``): the one its question was generated from."""
    dataset = make(task["dataset"], json.dumps(task["config"], sort_keys=True), task["seed"], task["size"])
    return dataset, dataset[task["index"]]
