"""toolrl plugin: the Berkeley Function Calling Leaderboard (bfcl-eval) as the ``bfcl`` environment, its
entries run as ``bfcl`` sessions and scored by BFCL's own checkers.

The entry point registers lazy references: listing plugins imports neither bfcl-eval nor this package's
modules.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_bfcl.environment:BFCL", name="bfcl")


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_bfcl.session:BfclSession", name="bfcl")
