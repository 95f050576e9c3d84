"""``toolrl tinker``: ``serve`` (the Tinker API; its limits' options built from
:class:`toolrl_tinker.limits.Limits`), ``tokenizers``, ``export`` and ``import``. Loaded whenever toolrl
builds its commands (and by the plugin probe, which never imports toolrl's CLI): click and the limits
table only; each command imports what it runs."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from toolrl_tinker.limits import Limits


@click.group("tinker")
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


def _limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """An option per limit of :class:`Limits` that has a help text, in the table's order."""
    types = typing.get_type_hints(Limits)
    for f in reversed(dataclasses.fields(Limits)):
        if "help" in f.metadata:
            least = f.metadata["least"]
            kind = click.IntRange(min=least) if types[f.name] is int else click.FloatRange(min=least, min_open=True)
            command = click.option(f"--{f.name.replace('_', '-')}", type=kind, default=f.default,
                                   show_default=f.default is not None, help=f.metadata["help"])(command)
    return command


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
@_limit_options
@click.option("--sampler", type=click.Choice(["auto", "transformers", "vllm"]), default="auto", show_default=True,
              help="The sampler's engine: vllm (its plugin and vLLM installed: each saved weight set a vLLM LoRA "
                   "adapter), transformers (toolrl's, on packed linears), auto: vllm where installed.")
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
def serve(bases: tuple[str, ...], host: str, port: int, state_dir: str, api_keys: tuple[str, ...], sampler: str,
          world_size: int, ray_address: str | None, gpus_per_rank: float, adapter_slots: int | None,
          **limits: Any) -> None:
    """Serve the Tinker API on the given base models (LoRA training clients, sampling)."""
    import asyncio
    import importlib.util

    from toolrl.cli import UsageFailure, user_errors
    from toolrl.config import RayConfig
    from toolrl.processes.step_group import StepGroup

    from toolrl_tinker.hub_names import base_spec
    from toolrl_tinker.sampler import engine_name
    from toolrl_tinker.server import serve_async
    from toolrl_tinker.trainer import Ranks

    on_ray = world_size > 1 or ray_address is not None or gpus_per_rank > 0
    if on_ray and importlib.util.find_spec("ray") is None:
        raise UsageFailure("--world-size/--ray-address: the trainer ranks run on Ray, which is not installed "
                           "(pip install 'toolrl-plugin-tinker[ranks]')")
    ranks = Ranks(world_size, RayConfig(address=ray_address or "local", num_gpus_per_trainer=gpus_per_rank)
                  if on_ray else None, adapter_slots)
    keys = _keys(api_keys)
    names = [user_errors(base_spec, spec)[0] for spec in bases]
    if len(set(names)) != len(names):
        raise UsageFailure(f"--base: a name is given twice ({', '.join(names)})")
    served = Limits(**limits, sampler=user_errors(engine_name, sampler))

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
    from toolrl.cli import user_errors

    from toolrl_tinker.adapter_transfer import export_merged

    click.echo(str(user_errors(export_merged, Path(state_dir), path, Path(out), dtype)))


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
    from toolrl.cli import user_errors

    from toolrl_tinker.adapter_transfer import import_peft
    from toolrl_tinker.hub_names import base_spec
    from toolrl_tinker.service import owner_of

    keys = _keys(api_keys)
    base_name, source = user_errors(base_spec, base)
    click.echo(user_errors(import_peft, Path(state_dir), Path(adapter), owner_of(keys[0]), base_name, source, name))


def _keys(api_keys: tuple[str, ...]) -> list[str]:
    from toolrl.cli import UsageFailure

    keys = [k for key in api_keys for k in key.split(",") if k]
    if not keys:
        raise UsageFailure("an API key is required: --api-key KEY or TINKER_API_KEY (clients send it as X-API-Key)")
    return keys
