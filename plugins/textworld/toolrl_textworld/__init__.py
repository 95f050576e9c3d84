"""toolrl plugin: TextWorld's generated text games as the ``textworld`` environment, each game a ``textworld``
session played on TextWorld's own engine, the model's command read by the ``textworld_command`` parser
or as an ``act`` tool call.

The entry point registers lazy references: listing plugins imports neither TextWorld nor this package's
modules.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_textworld.environment:TEXTWORLD", name="textworld")


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_textworld.session:TextworldSession", name="textworld")


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("toolrl_textworld.parser:CommandParser", name="textworld_command")
