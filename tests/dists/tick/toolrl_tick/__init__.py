"""A model family the core does not know: Tick, whose turns are framed by <|quad_start|>/<|quad_end|>
and whose model writes a call as a line ``CALL name {json arguments}``. Its parser and its family are
registered by lazy reference, as a plugin shipped for a new model on its release day would; so are
its advantage estimator, policy loss, context policy and curriculum, built from the public API alone."""

from toolrl import hookimpl
from toolrl.hookspecs import Register


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("toolrl_tick.parser:TickParser", name="tick")


@hookimpl
def register_model_families(register: Register) -> None:
    register("toolrl_tick.family:TICK", name="tick")


@hookimpl
def register_advantage_estimators(register: Register) -> None:
    register("toolrl_tick.algorithm:TickBaseline", name="tick_baseline")


@hookimpl
def register_policy_losses(register: Register) -> None:
    register("toolrl_tick.algorithm:TickPolicyGradient", name="tick_pg")


@hookimpl
def register_context_policies(register: Register) -> None:
    register("toolrl_tick.context:TickForget", name="tick_forget")


@hookimpl
def register_curricula(register: Register) -> None:
    register("toolrl_tick.curriculum:TickBackwards", name="tick_backwards")
