"""toolrl plugin: reasoning-gym's procedural generators as the ``reasoning_gym`` environment, scored
by the ``reasoning_gym`` reward (each generator's own ``score_answer``).

The entry point registers lazy references: loading the plugin imports nothing but toolrl's hooks, and
leaves the interpreter as it was (pycosat's stand-in goes in only where a generator is built: see ``sat``).
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_reward_functions(register: Register) -> None:
    register("toolrl_reasoning_gym.reward:ReasoningGymReward", name="reasoning_gym")


@hookimpl
def register_environments(register: Register) -> None:
    register("toolrl_reasoning_gym.environment:REASONING_GYM", name="reasoning_gym")
