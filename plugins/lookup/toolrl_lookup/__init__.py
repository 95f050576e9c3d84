"""toolrl plugin: the ``lookup-chain`` environment and its session (a stateful multi-turn task: follow
keys that only earlier lookups reveal, then answer).

This module is the plugin's entry point: it registers lazy references, so loading the plugin imports
nothing but toolrl's hook specifications.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_lookup.session:LookupSession", name="lookup-chain")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_lookup.environment:LOOKUP_CHAIN", name="lookup-chain")
