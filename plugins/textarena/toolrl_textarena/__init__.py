"""toolrl plugin: TextArena's two-player games as the ``textarena`` environment and its session kind
``textarena`` (each seat a role: ``player_0``, ``player_1``).

The entry point registers lazy references: loading the plugin imports nothing but toolrl's hooks.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_textarena.session:GameSession", name="textarena")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_textarena.environment:TEXTARENA", name="textarena")
