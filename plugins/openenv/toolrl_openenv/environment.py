"""The ``openenv`` environment: an OpenEnv server's tools and reward as a toolrl environment.

``env_options``: the server (``base_url``, or ``app``/``app_dir`` to start it; see
:class:`toolrl_openenv.config.OpenEnvBlock`), and the prompts: verl-format ``train_files``/``test_files``
(their ``extra_info.reset_kwargs`` are the ``reset`` kwargs), or else ``size`` copies of ``prompt``
(reset without kwargs). Each trajectory runs one ``openenv`` session (:mod:`toolrl_openenv.session`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from toolrl.environments import Environment, FileSplit

from toolrl_openenv.config import OpenEnvBlock

SPLITS = ("train", "test")
DEFAULT_PROMPT = "Use the tools to complete the task in this environment, then give your final answer."


class OpenEnvOptions(OpenEnvBlock):
    train_files: list[str] = Field([], description="verl-format prompts (default: `size` copies of `prompt`)")
    test_files: list[str] = Field([])
    prompt: str = Field(DEFAULT_PROMPT, description="the user message of generated samples")
    size: int = Field(64, gt=0, description="generated samples per split")


def generated(options: OpenEnvOptions, split: str) -> list[dict[str, Any]]:
    return [{"prompt": [{"role": "user", "content": options.prompt}], "extra_info": {"index": i}}
            for i in range(options.size)]


def configure(options: OpenEnvOptions) -> dict[str, Any]:
    block = options.model_dump(include=set(OpenEnvBlock.model_fields), exclude_none=True)
    splits: dict[str, Any] = {}
    for split in SPLITS:
        files = getattr(options, f"{split}_files")
        splits[split] = FileSplit(files=files) if files else generated
    return {"splits": splits, "session": "openenv", "session_options": block}


OPENENV = Environment(
    name="openenv",
    description="An OpenEnv environment server (env_options: base_url, or app to start one): its tools at "
                "reset, tool calls as steps, done ends the trajectory, the last observation's reward.",
    splits={split: generated for split in SPLITS},
    rewards=[],
    parser="hermes",
    max_turns=8,
    options=OpenEnvOptions,
    configure=configure,
)
