"""The ``geo3k`` environment: Geometry3K problems, the ``calc_geo3k_reward`` tool to check an answer
mid-rollout, and the ``geo3k`` reward on the final ``\\boxed{}`` answer.

Data comes from preprocessed verl-format parquet (``toolrl geo3k preprocess``; options
``train_files``/``test_files``) or, by default, from the Hugging Face dataset ``hub_id`` through
``datasets`` (each record converted as the preprocessor converts it; offline: the ``datasets``
cache with ``HF_DATASETS_OFFLINE=1``, or a local dataset directory as ``hub_id``).

Each problem's figure stays with its sample (``Sample.images``): a vision-language policy (a model
with a processor) sees it where the prompt says ``<image>``; a text model reads the prompt's text, and so
does a vision-language one with ``images: false``.
``crop_tool: true`` adds ``crop_image``, which shows the model a zoomed region of the figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from toolrl.environments import Environment, FileSplit, HubSplit

from toolrl_geo3k.preprocess import DATA_SOURCE, TOOL_NAME, convert_record

SPLITS = ("train", "test")


class Geo3kOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_files: list[str] = Field([], description="preprocessed parquet (toolrl geo3k preprocess)")
    test_files: list[str] = Field([], description="preprocessed parquet (toolrl geo3k preprocess)")
    hub_id: str = Field(DATA_SOURCE, description="Hugging Face dataset id or local dataset directory")
    hub_config: str | None = None
    revision: str | None = None
    crop_tool: bool = Field(False, description="add crop_image: zoom into the figure by a box (for a VLM policy)")
    images: bool = Field(True, description="give the figures to a vision-language policy; false: it reads the "
                         "problem's text only, as a text model does")


def record_row(record: dict[str, Any], options: Geo3kOptions, split: str) -> dict[str, Any]:
    """A Hub record (``problem``, ``answer``, ``images``) as the preprocessor's verl row."""
    return convert_record(record, split, None, Path(options.hub_id))


def configure(options: Geo3kOptions) -> dict[str, Any]:
    splits: dict[str, Any] = {}
    for split in SPLITS:
        files = getattr(options, f"{split}_files")
        splits[split] = FileSplit(files=files) if files else HubSplit(
            path=options.hub_id, name=options.hub_config, split=split, revision=options.revision)
    if options.crop_tool and not options.images:
        raise ValueError("crop_tool: crop_image shows parts of the figures, which images: false leaves out")
    tools = [*GEO3K_TOOLS, *([CROP_TOOL] if options.crop_tool else [])]
    return {"splits": splits, "tools": tools, "images": options.images}


GEO3K_TOOLS = [{"class_name": TOOL_NAME, "config": {"type": "native"}}]
CROP_TOOL = {"class_name": "crop_image", "config": {"type": "native"}}

GEO3K = Environment(
    name="geo3k",
    description="Geometry3K: answer in \\boxed{}, checking answers with calc_geo3k_reward on the way.",
    splits={split: HubSplit(path=DATA_SOURCE, split=split) for split in SPLITS},
    row=record_row,
    tools=GEO3K_TOOLS,
    rewards=[{"name": "geo3k", "weight": 1.0}],
    parser="hermes",
    max_turns=5,
    metric="geo3k",
    options=Geo3kOptions,
    configure=configure,
)
