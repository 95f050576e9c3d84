"""The built-in plugins. They register through the same hooks as external plugins (so any of them can
be disabled with ``TOOLRL_DISABLE_PLUGINS``) and use lazy references so that listing them imports
nothing heavy."""

from __future__ import annotations

from toolrl.hookspecs import Register, hookimpl


class HermesPlugin:
    @hookimpl
    def register_tool_parsers(self, register: Register) -> None:
        register("toolrl.parsers.hermes:HermesParser", name="hermes", aliases=("qwen", "qwen25", "qwen3"))


class TagsPlugin:
    @hookimpl
    def register_tool_parsers(self, register: Register) -> None:
        register("toolrl.parsers.tags:TagParser", name="tags")


class RewardsPlugin:
    @hookimpl
    def register_reward_functions(self, register: Register) -> None:
        register("toolrl.rewards.builtin:GSM8KReward", name="gsm8k")
        register("toolrl.rewards.builtin:MathReward", name="math")
        register("toolrl.rewards.builtin:FormatReward", name="format")


class TransformersEnginePlugin:
    @hookimpl
    def register_rollout_engines(self, register: Register) -> None:
        register("toolrl.engines.transformers:TransformersEngine", name="transformers", aliases=("hf",))


class JsonlLoggerPlugin:
    @hookimpl
    def register_loggers(self, register: Register) -> None:
        register("toolrl.loggers:JsonlLogger", name="jsonl")


BUILTINS = {
    "hermes": HermesPlugin(),
    "tags": TagsPlugin(),
    "rewards": RewardsPlugin(),
    "transformers": TransformersEnginePlugin(),
    "jsonl": JsonlLoggerPlugin(),
}
