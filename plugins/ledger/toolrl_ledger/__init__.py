"""toolrl plugin: the ``ledger`` environment (a long-horizon task for context policies) and its
``read_page`` tool.

This module is the plugin's entry point: it registers lazy references, so loading the plugin imports
nothing but toolrl's hook specifications.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_tools(register: Register) -> None:
    register("toolrl_ledger.tool:ReadPageTool", name="read_page")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_ledger.environment:LEDGER", name="ledger")
