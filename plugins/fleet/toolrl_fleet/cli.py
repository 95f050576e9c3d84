"""``toolrl env serve NAME``: one environment server of a fleet, added to the core's ``toolrl env`` group.
Light at import (click only)."""

from __future__ import annotations

import click
from toolrl.cli import UsageFailure, mapping_option


@click.command("serve")
@click.argument("name")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="The port (0: a free one, printed).")
@click.option("--capacity", default=256, show_default=True, type=click.IntRange(min=1),
              help="Sessions held at once; more are refused (HTTP 503).")
@click.option("--options", "options_json", default=None, help="JSON: the environment's options (env_options), "
              "or the session kind's options when NAME is a session kind.")
@click.option("--until-stdin-closes", is_flag=True, hidden=True)
def env_serve(name: str, host: str, port: int, capacity: int, options_json: str | None,
              until_stdin_closes: bool) -> None:
    """Serve the session of environment NAME (or the session kind NAME) over HTTP/WebSocket: one
    server of a fleet the `fleet` session kind spreads trajectories over."""
    import asyncio

    from toolrl.config import ConfigError
    from toolrl.plugin_support import after_startup

    from toolrl_fleet.server import run_server, served_kind

    def started(url: str) -> None:
        after_startup()  # the kind prepared: a process that will hold `capacity` sessions, as a rollout's
        click.echo(f"serving {name} (session {kind.name}) on {url}, capacity {capacity}", nl=True)

    try:
        kind = served_kind(name, mapping_option(options_json, "--options"))
        asyncio.run(run_server(kind, name, host, port, capacity, until_stdin_closes, started))
    except (ConfigError, ValueError) as exc:
        raise UsageFailure(str(exc)) from None

