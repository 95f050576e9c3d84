"""The built-in plugins. They register through the same hooks as external plugins (so any of them can
be disabled with ``TOOLRL_DISABLE_PLUGINS``) and use lazy references so that listing them imports
nothing heavy."""

from __future__ import annotations

from toolrl.hookspecs import Register, hookimpl


class ParserPlugin:
    """One tool-call parser (:mod:`toolrl.parsers`), registered by lazy reference."""

    def __init__(self, ref: str, name: str, aliases: tuple[str, ...] = ()) -> None:
        self.ref, self.name, self.aliases = ref, name, aliases

    @hookimpl
    def register_tool_parsers(self, register: Register) -> None:
        register(self.ref, name=self.name, aliases=self.aliases)


PARSERS = {
    "hermes": ParserPlugin("toolrl.parsers.hermes:HermesParser", "hermes", ("qwen", "qwen25", "qwen3")),
    "tags": ParserPlugin("toolrl.parsers.tags:TagParser", "tags"),
    "qwen3_coder": ParserPlugin("toolrl.parsers.qwen3_coder:Qwen3CoderParser", "qwen3_coder", ("qwen3_xml",)),
    "llama3_json": ParserPlugin("toolrl.parsers.llama3_json:Llama3JsonParser", "llama3_json", ("llama3",)),
    "mistral": ParserPlugin("toolrl.parsers.mistral:MistralParser", "mistral"),
    "deepseek_v3": ParserPlugin("toolrl.parsers.deepseek_v3:DeepSeekV3Parser", "deepseek_v3"),
    "glm45": ParserPlugin("toolrl.parsers.glm45:Glm45Parser", "glm45", ("glm47",)),
    "gpt_oss": ParserPlugin("toolrl.parsers.gpt_oss:GptOssParser", "gpt_oss", ("harmony",)),
    "gemma": ParserPlugin("toolrl.parsers.gemma:GemmaParser", "gemma", ("gemma4",)),
    "pythonic": ParserPlugin("toolrl.parsers.pythonic:PythonicParser", "pythonic"),
}


class FamilyPlugin:
    """One built-in model family (:mod:`toolrl.families.builtin`), registered by lazy reference."""

    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    def register_model_families(self, register: Register) -> None:
        register(f"toolrl.families.builtin:{self.name.upper()}", name=self.name)


# Named family-<name>: a parser plugin may already have the family's name.
MODEL_FAMILIES = {f"family-{name}": FamilyPlugin(name) for name in (
    "qwen3_5", "qwen3", "qwen2_5", "chatml", "llama3", "deepseek_v3", "mistral", "gpt_oss", "glm45", "gemma3", "gemma")}


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


class ScriptedEnginePlugin:
    """Fixed model turns for environment and tool authors (:mod:`toolrl.testing.scripted_engine`)."""

    @hookimpl
    def register_rollout_engines(self, register: Register) -> None:
        register("toolrl.testing.scripted_engine:ScriptedEngine", name="scripted")


class JsonlLoggerPlugin:
    @hookimpl
    def register_loggers(self, register: Register) -> None:
        register("toolrl.loggers:JsonlLogger", name="jsonl")


class AlgorithmsPlugin:
    """The built-in advantage estimators and policy losses (:mod:`toolrl.algorithms`)."""

    @hookimpl
    def register_advantage_estimators(self, register: Register) -> None:
        for name, cls in (("grpo", "Grpo"), ("dr_grpo", "DrGrpo"), ("rloo", "Rloo"), ("reinforce_pp", "ReinforcePP"),
                          ("reinforce_pp_baseline", "ReinforcePPBaseline")):
            register(f"toolrl.algorithms.advantages:{cls}", name=name)
        register("toolrl.algorithms.gae:Gae", name="gae")
        register("toolrl.algorithms.gigpo:Gigpo", name="gigpo")
        register("toolrl.algorithms.tree_grpo:TreeGrpo", name="tree_grpo")
        register("toolrl.algorithms.distill:Opd", name="opd")

    @hookimpl
    def register_policy_losses(self, register: Register) -> None:
        for name, cls in (("ppo_clip", "PpoClip"), ("gspo", "Gspo"), ("cispo", "Cispo")):
            register(f"toolrl.algorithms.losses:{cls}", name=name)
        register("toolrl.algorithms.distill:TopkForwardKl", name="topk_forward_kl")


class ContextPoliciesPlugin:
    """The built-in context policies (:mod:`toolrl.context`)."""

    @hookimpl
    def register_context_policies(self, register: Register) -> None:
        for name, cls in (("none", "ContextPolicy"), ("drop_tool_outputs", "DropToolOutputs"),
                          ("window", "Window"), ("summarise", "Summarise"), ("fold", "Fold")):
            register(f"toolrl.context:{cls}", name=name, aliases=("summarize",) if name == "summarise" else ())


class CurriculaPlugin:
    """The built-in curricula (:mod:`toolrl.curricula`)."""

    @hookimpl
    def register_curricula(self, register: Register) -> None:
        for name, cls in (("uniform", "Curriculum"), ("pass_rate", "PassRate"), ("env_difficulty", "EnvDifficulty")):
            register(f"toolrl.curricula:{cls}", name=name)


class WeightTransportsPlugin:
    """The built-in weight transports (:mod:`toolrl.transports`)."""

    @hookimpl
    def register_weight_transports(self, register: Register) -> None:
        for name, cls in (("object_store", "ObjectStoreTransport"), ("broadcast", "BroadcastTransport"),
                          ("shared_memory", "SharedMemoryTransport"), ("disk", "DiskTransport")):
            register(f"toolrl.transports.{name}:{cls}", name=name)  # each in the module of its name


class AgentsPlugin:
    """The built-in agents (:mod:`toolrl.agents`): a program per episode, or a function in-process; and the
    APIs the gateway serves their clients (:mod:`toolrl.gateway`): OpenAI's two."""

    @hookimpl
    def register_agents(self, register: Register) -> None:
        register("toolrl.agents.program:CommandAgent", name="command")
        register("toolrl.agents.function:CallableAgent", name="callable")

    @hookimpl
    def register_gateway_protocols(self, register: Register) -> None:
        register("toolrl.gateway.chat_completions:ChatCompletions", name="chat_completions")
        register("toolrl.gateway.responses:Responses", name="responses")


BUILTINS = {
    **PARSERS,
    **MODEL_FAMILIES,
    "rewards": RewardsPlugin(),
    "transformers": TransformersEnginePlugin(),
    "scripted": ScriptedEnginePlugin(),
    "jsonl": JsonlLoggerPlugin(),
    "algorithms": AlgorithmsPlugin(),
    "context": ContextPoliciesPlugin(),
    "curricula": CurriculaPlugin(),
    "weight_transports": WeightTransportsPlugin(),
    "agents": AgentsPlugin(),
}
