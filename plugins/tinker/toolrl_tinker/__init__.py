"""toolrl plugin: the Tinker API served by toolrl (``toolrl tinker serve``), so the official ``tinker``
SDK and tinker-cookbook's recipes train and sample toolrl's models; and the Tinker losses toolrl lacked
(``importance_sampling``, ``cross_entropy``, ``dro``) as policy losses.

This module is the entry point: it registers lazy references only (no torch, no HTTP stack).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl import hookimpl
from toolrl.hookspecs import Register

if TYPE_CHECKING:
    import click

__version__ = "0.1.0"


@hookimpl
def register_policy_losses(register: Register) -> None:
    for name, cls in (("importance_sampling", "ImportanceSampling"), ("cross_entropy", "CrossEntropy"),
                      ("dro", "Dro")):
        register(f"toolrl_tinker.losses:{cls}", name=name)


@hookimpl
def register_commands(cli: click.Group) -> None:
    import click

    @cli.group("tinker")
    def tinker() -> None:
        """The Tinker API (the official tinker SDK's) served by toolrl."""

    @tinker.command("tokenizers")
    @click.argument("names", nargs=-1)
    @click.option("--hub-cache", type=click.Path(file_okay=False), default=None,
                  help="The Hugging Face cache to write (default: HF_HUB_CACHE, else ~/.cache/huggingface/hub).")
    def tokenizers(names: tuple[str, ...], hub_cache: str | None) -> None:
        """Write the tokenizer files of base models this server holds (default: tiny-qwen3 and
        HuggingFaceTB/SmolLM2-135M-Instruct) into a Hugging Face cache, under those names, so that a client
        (tinker-cookbook's get_tokenizer, the SDK) loads them by name offline; prints the variables to set."""
        from toolrl.cli import user_errors

        from toolrl_tinker.hub_names import OFFLINE_NAMES, write_hub_cache

        root = user_errors(write_hub_cache, names or OFFLINE_NAMES, hub_cache)
        click.echo(f"export HF_HUB_CACHE={root.resolve()} HF_HUB_OFFLINE=1")

    @tinker.command("serve")
    @click.option("--base", "bases", multiple=True, default=("tiny-qwen3",), show_default=True,
                  help="A base model to hold (repeat): tiny-qwen3, smollm2-135m-instruct "
                       "(also as HuggingFaceTB/SmolLM2-135M-Instruct), a directory or a Hub id.")
    @click.option("--host", default="127.0.0.1", show_default=True, help="Bind address.")
    @click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                  help="Port (0: any free one; the URL is printed).")
    @click.option("--state-dir", type=click.Path(file_okay=False), default="runs/tinker", show_default=True,
                  help="Runs, checkpoints and futures, kept across restarts.")
    @click.option("--api-key", "api_keys", multiple=True, envvar="TINKER_API_KEY",
                  help="A key clients may send (repeat; default: $TINKER_API_KEY). Each key sees only its own "
                       "models, checkpoints and futures.")
    @click.option("--max-batch-tokens", type=click.IntRange(min=1), default=65536, show_default=True,
                  help="Most tokens in one forward_backward request.")
    @click.option("--micro-batch-tokens", type=click.IntRange(min=1), default=512, show_default=True,
                  help="Most tokens one forward pass holds: a request runs in micro-batches of this many "
                       "(gradients accumulated), which bounds the memory a request takes.")
    @click.option("--max-samplers", type=click.IntRange(min=1), default=4, show_default=True,
                  help="Saved weight sets a training run keeps on the sampler (older ones reload from file).")
    @click.option("--max-runs-per-client", type=click.IntRange(min=1), default=16, show_default=True,
                  help="Training runs one API key may hold at once.")
    @click.option("--sampler", type=click.Choice(["auto", "transformers", "vllm"]), default="auto", show_default=True,
                  help="The sampler's engine: vllm (its plugin and vLLM installed: each saved weight set a vLLM LoRA "
                       "adapter), transformers (toolrl's, on packed linears), auto: vllm where installed.")
    @click.option("--sampler-slots", type=click.IntRange(min=1), default=32, show_default=True,
                  help="Saved weight sets resident on the sampler's engine at once (transformers max_adapters, vLLM "
                       "max_loras); the least recently used others wait in host memory.")
    @click.option("--world-size", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Trainer ranks per base: more than 1 runs them on Ray, the base sharded over them (FSDP2) "
                       "and each client's adapter on every rank.")
    @click.option("--ray-address", default=None,
                  help="The Ray cluster the trainer ranks run on, as toolrl train's ray.address: local (a "
                       "private one on this machine), auto, or host:port. Default: in this process with one rank, "
                       "local with more.")
    @click.option("--gpus-per-rank", type=click.FloatRange(min=0), default=0.0, show_default=True,
                  help="GPUs each trainer rank takes on Ray (ray.num_gpus_per_trainer; 0: CPU ranks, gloo).")
    @click.option("--adapter-slots", type=click.IntRange(min=1), default=None,
                  help="Clients' adapters a trainer holds in its model at once; the least recently used ones "
                       "wait in host memory (with their gradients and optimizer state) until their next request. "
                       "Default: every client's in the model.")
    def serve(bases: tuple[str, ...], host: str, port: int, state_dir: str, api_keys: tuple[str, ...],
              max_batch_tokens: int, micro_batch_tokens: int, max_samplers: int, max_runs_per_client: int,
              sampler: str, sampler_slots: int, world_size: int, ray_address: str | None, gpus_per_rank: float,
              adapter_slots: int | None) -> None:
        """Serve the Tinker API on the given base models (LoRA training clients, sampling)."""
        import asyncio
        import importlib.util
        from pathlib import Path

        from toolrl.cli import UsageFailure, user_errors
        from toolrl.config import RayConfig
        from toolrl.processes.step_group import StepGroup

        from toolrl_tinker.sampler import engine_name
        from toolrl_tinker.server import serve_async
        from toolrl_tinker.service import Limits
        from toolrl_tinker.trainer import Ranks

        on_ray = world_size > 1 or ray_address is not None or gpus_per_rank > 0
        if on_ray and importlib.util.find_spec("ray") is None:
            raise UsageFailure("--world-size/--ray-address: the trainer ranks run on Ray, which is not installed "
                               "(pip install 'toolrl-plugin-tinker[ranks]')")
        ranks = Ranks(world_size, RayConfig(address=ray_address or "local", num_gpus_per_trainer=gpus_per_rank)
                      if on_ray else None, adapter_slots)
        keys = [k for key in api_keys for k in key.split(",") if k]
        if not keys:
            raise UsageFailure("an API key is required: --api-key KEY or TINKER_API_KEY (clients send it as X-API-Key)")
        limits = Limits(max_batch_tokens=max_batch_tokens, micro_batch_tokens=micro_batch_tokens,
                        max_samplers=max_samplers, max_runs_per_client=max_runs_per_client,
                        sampler=user_errors(engine_name, sampler), sampler_slots=sampler_slots)

        def run() -> None:
            if ranks.ray is not None:  # here, in the main thread (StepGroup.connect)
                StepGroup.connect(ranks.ray, world_size)
            asyncio.run(serve_async(list(bases), Path(state_dir), keys, host, port, limits,
                                    announce=lambda line: click.echo(line, err=True), ranks=ranks))

        try:
            user_errors(run)
        except KeyboardInterrupt:
            return
        finally:
            if ranks.ray is not None:
                import ray

                ray.shutdown()
