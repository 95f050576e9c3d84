"""toolrl plugin for Geometry3K: the ``calc_geo3k_reward`` tool (also answering to verl's class path,
so verl tool configs load unchanged), the ``crop_image`` tool (a zoom into the figure, returning an
image), the ``geo3k`` reward function, the ``geo3k`` environment and
``toolrl geo3k preprocess``.

This module is the plugin's entry point: it registers lazy references only, so loading the plugin
imports neither math-verify nor pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl import hookimpl
from toolrl.hookspecs import Register

if TYPE_CHECKING:
    import click

__version__ = "0.1.0"


@hookimpl
def register_tools(register: Register) -> None:
    register(
        "toolrl_geo3k.tool:Geo3kTool", name="calc_geo3k_reward", aliases=("verl.tools.geo3k_tool.Geo3kTool",)
    )
    register("toolrl_geo3k.crop:CropImageTool", name="crop_image")


@hookimpl
def register_reward_functions(register: Register) -> None:
    register("toolrl_geo3k.reward:Geo3kReward", name="geo3k")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_geo3k.environment:GEO3K", name="geo3k")


@hookimpl
def register_commands(cli: click.Group) -> None:
    from toolrl_geo3k.cli import geo3k

    cli.add_command(geo3k)
