"""The ``verifiers`` environment: a verifiers taskset (``env_options.module``) as toolrl data and one
``verifiers`` environment session per trajectory. Its tasks are the samples (``select`` /
``test_select`` pick the train and test splits); the session hands out its toolsets' tools and scores
with its tasks' rewards and judges (one term per reward, their weighted sum the reward).
"""

from __future__ import annotations

from typing import Any

from toolrl.environments import Environment

from toolrl_verifiers.loading import VerifiersOptions, load, task_rows


def configure(options: VerifiersOptions) -> dict[str, Any]:
    loaded = load(options)  # a broken environment fails here, as the config error naming env_options
    return {
        "description": f"verifiers taskset {type(loaded.taskset).__name__} ({options.module})",
        "splits": {"train": task_rows, "test": task_rows},  # test: test_select's tasks (none: an error naming it)
        "session": "verifiers",
        "session_options": {**options.model_dump(include={"module", "args"}), "parser": options.parser},
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
