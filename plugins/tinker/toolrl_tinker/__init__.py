"""toolrl plugin: the Tinker API served by toolrl (``toolrl tinker serve``), so the official ``tinker``
SDK and tinker-cookbook's recipes train and sample toolrl's models; and the Tinker losses toolrl lacked
(``importance_sampling``, ``cross_entropy``, ``dro``) as policy losses.

This module is the entry point: it registers lazy references only (no torch, no HTTP stack).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
                  help="A base model to hold (repeat): tiny-qwen3, smollm2-135m-instruct (also as "
                       "HuggingFaceTB/SmolLM2-135M-Instruct), a directory or a Hub id; NAME=SOURCE offers SOURCE "
                       "under NAME (e.g. Qwen/Qwen3-4B-Instruct-2507=smollm2-135m-instruct).")
    @click.option("--host", default="127.0.0.1", show_default=True, help="Bind address.")
    @click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                  help="Port (0: any free one; the URL is printed).")
    @click.option("--state-dir", type=click.Path(file_okay=False), default="runs/tinker", show_default=True,
                  help="Runs, checkpoints and futures, kept across restarts.")
    @click.option("--api-key", "api_keys", multiple=True, envvar="TINKER_API_KEY",
                  help="A key clients may send (repeat; default: $TINKER_API_KEY). Each key sees only its own "
                       "models, checkpoints and futures.")
    @click.option("--max-batch-tokens", type=click.IntRange(min=1), default=65536, show_default=True,
                  help="Most tokens in one forward_backward request (the SDK sends larger ones in pieces).")
    @click.option("--micro-batch-tokens", type=click.IntRange(min=1), default=512, show_default=True,
                  help="Most tokens one forward pass holds: a request runs in micro-batches of this many "
                       "(gradients accumulated), which bounds the memory a request takes, each in its turn.")
    @click.option("--max-samplers", type=click.IntRange(min=1), default=4, show_default=True,
                  help="Saved weight sets a training run keeps on the sampler (older ones reload from file).")
    @click.option("--max-runs-per-client", type=click.IntRange(min=1), default=16, show_default=True,
                  help="Training clients one API key may hold at once.")
    @click.option("--max-futures-per-client", type=click.IntRange(min=1), default=256, show_default=True,
                  help="Requests one API key may have queued or running; more are answered 429 (the SDK waits).")
    @click.option("--max-tokens-per-client", type=click.IntRange(min=1), default=1 << 20, show_default=True,
                  help="Tokens one API key's requests queued or running may hold (a sample: its prompt and "
                       "num_samples x max_tokens); more are answered 429 (the SDK waits).")
    @click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
                  help="Seconds one request may hold a base (its micro-batches; a sample from its arrival); "
                       "past it the request stops and fails.")
    @click.option("--session-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
                  help="Seconds without a heartbeat (the SDK sends one every 10 s) after which a client's session "
                       "ends and its training clients leave memory (what they saved stays).")
    @click.option("--keep-checkpoints", type=click.IntRange(min=0), default=0, show_default=True,
                  help="Checkpoints kept per training run and kind, the latest (0: all).")
    @click.option("--checkpoint-ttl", type=click.FloatRange(min=0, min_open=True), default=None,
                  help="Seconds a checkpoint is kept when its save names no TTL (default: no expiry).")
    @click.option("--max-request-bytes", type=click.IntRange(min=1), default=64 << 20, show_default=True,
                  help="Most bytes one request body holds (decompressed).")
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
              sampler: str, sampler_slots: int, world_size: int, ray_address: str | None, gpus_per_rank: float,
              adapter_slots: int | None, **limits: Any) -> None:
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
        keys = _keys(api_keys)
        names = [_base(spec)[0] for spec in bases]
        if len(set(names)) != len(names):
            raise UsageFailure(f"--base: a name is given twice ({', '.join(names)})")
        served = Limits(**limits, sampler=user_errors(engine_name, sampler), sampler_slots=sampler_slots)

        def run() -> None:
            if ranks.ray is not None:  # here, in the main thread (StepGroup.connect)
                StepGroup.connect(ranks.ray, world_size)
            asyncio.run(serve_async(list(bases), Path(state_dir), keys, host, port, served,
                                    announce=lambda line: click.echo(line, err=True), ranks=ranks))

        try:
            user_errors(run)
        except KeyboardInterrupt:
            return
        finally:
            if ranks.ray is not None:
                import ray

                ray.shutdown()

    @tinker.command("export")
    @click.argument("path")
    @click.argument("out", type=click.Path(file_okay=False))
    @click.option("--state-dir", type=click.Path(file_okay=False, exists=True), default="runs/tinker", show_default=True,
                  help="The server's state directory.")
    @click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True,
                  help="The exported weights' dtype.")
    def export(path: str, out: str, state_dir: str, dtype: str) -> None:
        """Write checkpoint PATH (a tinker:// path: a training state, sampler weights or external weights)
        merged into its base model's weights to OUT, a Hugging Face model directory (from_pretrained loads it)."""
        from pathlib import Path

        from toolrl_tinker.adapter_transfer import export_merged

        click.echo(str(_plugin_errors(export_merged, Path(state_dir), path, Path(out), dtype)))

    @tinker.command("import")
    @click.argument("adapter", type=click.Path(file_okay=False, exists=True))
    @click.option("--base", "base", required=True,
                  help="The base it adapts, as `serve --base` names it (NAME or NAME=SOURCE).")
    @click.option("--state-dir", type=click.Path(file_okay=False), default="runs/tinker", show_default=True,
                  help="The server's state directory (the server may be running).")
    @click.option("--api-key", "api_keys", multiple=True, envvar="TINKER_API_KEY",
                  help="The key whose checkpoint it becomes (default: $TINKER_API_KEY).")
    @click.option("--name", default=None, help="The checkpoint's name (default: the directory's).")
    def import_adapter(adapter: str, base: str, state_dir: str, api_keys: tuple[str, ...], name: str | None) -> None:
        """Make PEFT LoRA adapter directory ADAPTER a checkpoint of the key's, on base --base; prints its
        tinker:// path, which that client passes to create_training_client_from_state (or samples)."""
        from pathlib import Path

        from toolrl_tinker.adapter_transfer import import_peft
        from toolrl_tinker.service import owner_of

        keys = _keys(api_keys)
        base_name, source = _base(base)
        click.echo(_plugin_errors(import_peft, Path(state_dir), Path(adapter), owner_of(keys[0]), base_name, source, name))


def _keys(api_keys: tuple[str, ...]) -> list[str]:
    from toolrl.cli import UsageFailure

    keys = [k for key in api_keys for k in key.split(",") if k]
    if not keys:
        raise UsageFailure("an API key is required: --api-key KEY or TINKER_API_KEY (clients send it as X-API-Key)")
    return keys


def _base(spec: str) -> tuple[str, str]:
    from toolrl.cli import UsageFailure

    from toolrl_tinker.hub_names import base_spec

    try:
        return base_spec(spec)
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None


def _plugin_errors(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the plugin's user errors (and toolrl's) as one line, exit 2."""
    from toolrl.cli import UsageFailure, user_errors

    from toolrl_tinker.requests import UserError

    try:
        return user_errors(fn, *args)
    except UserError as exc:
        raise UsageFailure(str(exc)) from None
