"""toolrl plugin: the ``duo`` environment (two-number word problems) and the program that solves them in
two roles, a planner and an executor, each a model name at the gateway (``toolrl_duo.agent``).

This module is the plugin's entry point: it registers lazy references, so loading the plugin imports
nothing but toolrl's hook specifications.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_duo.problems:DUO", name="duo")
