"""toolrl plugin: the ``corridor`` environment and its session (a text maze: one reward at the exit,
wrong moves that cost turns but do not end the episode, the same rooms visited across a group).

This module is the plugin's entry point: it registers lazy references, so loading the plugin imports
nothing but toolrl's hook specifications.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_corridor.session:CorridorSession", name="corridor")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_corridor.environment:CORRIDOR", name="corridor")
