"""The ``verifiers`` environment: a verifiers taskset (``env_options.module``) as toolrl data, tools and
reward. Its tasks are the samples (``select`` / ``test_select`` pick the train and test splits), its
toolsets' ``@vf.tool`` methods the tools (the ``verifiers`` tool), and its tasks' rewards and judges
the reward (the ``verifiers`` reward function: one term per reward, their weighted sum the reward).
"""

from __future__ import annotations

from typing import Any

from toolrl.environments import Environment

from toolrl_verifiers.loading import VerifiersOptions, load, task_rows


def configure(options: VerifiersOptions) -> dict[str, Any]:
    loaded = load(options)  # a broken environment fails here, as the config error naming env_options
    splits: dict[str, Any] = {"train": task_rows}
    if options.test_select is not None:
        splits["test"] = task_rows
    entry = options.model_dump(include={"module", "args"})
    tools = [{"class_name": "verifiers", "config": {"type": "native"}, "verifiers": entry}] if loaded.toolsets else []
    return {
        "description": f"verifiers taskset {type(loaded.taskset).__name__} ({options.module})",
        "splits": splits,
        "tools": tools,
        "rewards": [{"name": "verifiers", "options": {**entry, "parser": options.parser}}],
        "parser": options.parser,
        "max_turns": options.max_turns,
    }


VERIFIERS = Environment(
    name="verifiers",
    description="A verifiers environment (env_options.module): its tasks, toolsets and rewards.",
    splits={"train": task_rows},
    tools=[],
    rewards=[],
    options=VerifiersOptions,
    configure=configure,
)
