"""toolrl plugin: the ``vllm`` rollout engine (vLLM's async engine, CPU or GPU).

This module is the plugin's entry point: it registers a lazy reference, so loading the plugin imports
neither vLLM nor torch.
"""

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"


@hookimpl
def register_rollout_engines(register: Register) -> None:
    register("toolrl_vllm.engine:VLLMEngine", name="vllm")
