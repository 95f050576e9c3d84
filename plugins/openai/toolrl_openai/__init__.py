"""toolrl plugin for OpenAI-compatible APIs.

- The ``openai`` rollout engine: rollouts on any OpenAI-compatible server (vLLM, SGLang,
  ``toolrl serve``, hosted APIs), token-exact where the server returns token ids.
- The ``judge`` reward function: a model behind an OpenAI-compatible endpoint grades each
  finished trajectory against a rubric (``toolrl_openai.judge``).
- ``toolrl serve CONFIG``: the configured engine and model behind an OpenAI-compatible API, with
  tool calls parsed by the configured parser and, with ``--record DIR``, every served conversation
  written as a token-exact trajectory.

This module is the entry point: it registers lazy references only, so loading the plugin imports
neither ``openai`` nor the HTTP stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl import hookimpl
from toolrl.hookspecs import Register

if TYPE_CHECKING:
    import click

__version__ = "0.1.0"


@hookimpl
def register_rollout_engines(register: Register) -> None:
    register("toolrl_openai.engine:OpenAIEngine", name="openai")


@hookimpl
def register_reward_functions(register: Register) -> None:
    register("toolrl_openai.judge:JudgeReward", name="judge")


@hookimpl
def register_commands(cli: click.Group) -> None:
    import click

    @cli.command("serve", context_settings={"ignore_unknown_options": True})
    @click.argument("config_path", metavar="CONFIG.yaml", type=click.Path(exists=True, dir_okay=False))
    @click.argument("overrides", nargs=-1)
    @click.option("--host", default="127.0.0.1", show_default=True, help="Bind address.")
    @click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                  help="Port (0: any free one; the URL is printed).")
    @click.option("--record", "record_dir", type=click.Path(file_okay=False),
                  help="Write every served conversation as a token-exact trajectory to DIR/trajectories.jsonl.")
    @click.option("--idle-timeout", "idle_s", type=click.FloatRange(min=0, min_open=True), default=600.0,
                  show_default=True, help="Seconds after which a silent conversation is closed (and recorded).")
    @click.option("--max-conversations", type=click.IntRange(min=1), default=4096, show_default=True,
                  help="Open conversations kept; beyond it the least recently used is closed.")
    @click.option("--token-history", is_flag=True,
                  help="Continue a recognised chat conversation from the exact tokens served, adding only the "
                       "template's rendering of the new messages (as training rollouts do); default: render "
                       "every request from its messages.")
    @click.option("--served-model-name", help="The model id clients send (default: model.source).")
    def serve(config_path: str, overrides: tuple[str, ...], host: str, port: int, record_dir: str | None,
              idle_s: float, max_conversations: int, token_history: bool, served_model_name: str | None) -> None:
        """Serve the configured model behind an OpenAI-compatible API (/v1/chat/completions,
        /v1/completions, /v1/models). OVERRIDES are dotted.key=value pairs."""
        import asyncio
        from pathlib import Path

        from toolrl.cli import UsageFailure, user_errors
        from toolrl.config import load_config

        from toolrl_openai.server import serve_async

        def run() -> None:
            config = load_config(config_path, list(overrides))
            asyncio.run(serve_async(config, host, port, Path(record_dir) if record_dir else None, idle_s,
                                    max_conversations, served_model_name, token_history,
                                    announce=lambda line: click.echo(line, err=True)))

        try:
            user_errors(run)  # config, part-name and model-source errors: one line, exit 2
        except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down gracefully and re-raised it
            return
        except OSError as exc:
            if exc.errno is None:
                raise
            raise UsageFailure(f"cannot listen on {host}:{port}: {exc.strerror}") from None
