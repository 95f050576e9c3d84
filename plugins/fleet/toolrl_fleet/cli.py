"""``toolrl env serve NAME``: one environment server of a fleet; ``toolrl env bench NAME``: how many
sessions an environment holds, in-process or through a fleet. Both join the core's ``toolrl env`` group.
Light at import (click only)."""

from __future__ import annotations

import json

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


def _counts(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """``--ladder``'s comma-separated counts, each a whole number of trajectories, at least 1."""
    counts = [x.strip() for x in value.split(",")]
    bad = next((x for x in counts if not x.isdigit() or int(x) < 1), None)
    if bad is not None:
        raise click.BadParameter(f"{bad!r} is not a count of trajectories (a whole number, at least 1)")
    return [int(x) for x in counts]


@click.command("bench")
@click.argument("name")
@click.option("--ladder", default="16,128", show_default=True, callback=_counts,
              help="Comma-separated concurrent trajectory counts.")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1),
              help="Steps per trajectory.")
@click.option("--think-s", default=0.1, show_default=True, type=click.FloatRange(min=0),
              help="Mean think time between a trajectory's steps (a model's generation time).")
@click.option("--split", default=None,
              help="The split whose samples reset the trajectories (default: the first).")
@click.option("--options", "options_json", default=None,
              help="JSON: the environment's options (env_options).")
@click.option("--session", default=None,
              help="Another session kind to drive it through (one that serves the environment's sessions: "
              "fleet).")
@click.option("--session-options", "session_json", default=None, help="JSON: that session kind's options.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env_bench(name: str, ladder: list[int], steps: int, think_s: float, split: str | None,
              options_json: str | None, session: str | None, session_json: str | None, as_json: bool) -> None:
    """Drive N concurrent trajectories of environment NAME with a scripted policy (no model), as the
    rollout drives them: throughput, p50/p99 step latency, client memory per open trajectory, errors
    by kind, trajectories masked (the environment failed) and lost."""
    import asyncio

    from toolrl.config import ConfigError

    from toolrl_fleet.load import RungResult, environment_driver, measure_rung

    async def rungs(counts: list[int]) -> list[RungResult]:
        driver = await environment_driver(name, mapping_option(options_json, "--options"), split, session,
                                          mapping_option(session_json, "--session-options"))
        await driver.prepare()
        try:
            return [await measure_rung(driver, n, steps, think_s) for n in counts]
        finally:
            await driver.shutdown()

    try:
        results = asyncio.run(rungs(ladder))
    except (ConfigError, ValueError) as exc:
        raise UsageFailure(str(exc)) from None
    if as_json:
        click.echo(json.dumps([r.model_dump() for r in results], indent=2))
        return
    click.echo(f"{name}: {steps} steps per trajectory, think {think_s:g} s (x U[0.5, 1.5])")
    click.echo(f"{'n':>6} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'KiB/traj':>9} {'done':>6} "
               f"{'masked':>6} {'lost':>5}  errors")
    for r in results:
        errors = ", ".join(f"{k} x{v}" for k, v in r.errors.items()) or "-"
        click.echo(f"{r.n:>6} {r.steps_per_s:>9.1f} {1000 * r.p50_s:>8.2f} {1000 * r.p99_s:>8.2f} "
                   f"{r.kib_per_session:>9.1f} {r.completed:>6} {r.masked:>6} {r.lost:>5}  {errors}")
