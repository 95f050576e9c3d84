"""toolrl plugin: the ``calculator`` tool (safe, bounded arithmetic) and the ``arithmetic``
environment (synthetic questions answered with it).

This module is the plugin's entry point: it registers lazy references, so loading the plugin imports
nothing but toolrl's hook specifications.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_tools(register: Register) -> None:
    register("toolrl_calculator.tool:CalculatorTool", name="calculator")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_calculator.environment:ARITHMETIC", name="arithmetic")
