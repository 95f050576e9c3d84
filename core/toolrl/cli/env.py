"""``toolrl env list``, ``show`` and ``bench``: the installed environments, one under load (a plugin's
``register_commands`` may add more to the group). Light at import (click only); listing imports the
environments' modules and generates their splits, never torch."""

from __future__ import annotations

import json
from typing import Any

import click

from toolrl.cli.errors import UsageFailure, mapping_option, user_errors


@click.group("env")
def env() -> None:
    """List the installed environments and show one."""


def _with_defaults(environment: Any) -> tuple[Any, Any, str | None]:
    """The environment adapted to its default options, the options, and the error when it has
    options without defaults (then the environment as registered)."""
    from toolrl.config import ConfigError

    try:
        resolved, options = environment.resolve({})
    except ConfigError as exc:
        return environment, None, str(exc)
    return resolved, options, None


def _describe(name: str, plugin: str, environment: Any, count: bool = False) -> dict[str, Any]:
    """Summary plus each split's source and size with the default options. Hub splits are not
    downloaded to be counted, nor the generated splits of an environment not ``sized`` unless ``count``
    (size null); a split that fails to load shows its error."""
    from toolrl.config import ConfigError
    from toolrl.data.sources import load_split
    from toolrl.environments import HubSplit

    resolved, options, error = _with_defaults(environment)
    row = {**resolved.summary(), "name": name, "plugin": plugin}
    sources, row["splits"] = row["splits"], {}
    for split, source in resolved.splits.items():
        info: dict[str, Any] = {"source": sources[split], "size": None}
        if error is not None:
            info["error"] = error
        elif not isinstance(source, HubSplit) and (count or resolved.sized or not callable(source)):
            try:
                info["size"] = len(load_split(resolved, split, options))
            except ConfigError as exc:
                info["error"] = str(exc)
        row["splits"][split] = info
    return row


def _rows() -> list[dict[str, Any]]:
    from toolrl.config import ConfigError
    from toolrl.plugins.parts import lookup_part, registered_parts

    rows = []
    for part in registered_parts("environments"):
        try:
            rows.append(_describe(part.name, part.plugin, lookup_part("environments", part.name, "env")))
        except ConfigError as exc:  # a broken environment is listed with its error, not fatal
            rows.append({"name": part.name, "plugin": part.plugin, "error": str(exc).removeprefix("env: ")})
    return rows


@env.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env_list(as_json: bool) -> None:
    """Every installed environment: plugin, splits and sizes, tools, rewards."""
    rows = _rows()
    if as_json:
        click.echo(json.dumps([{k: v for k, v in r.items() if k != "options"} for r in rows], indent=2))
        return
    for r in rows:
        if "error" in r:
            click.echo(f"{r['name']:<14} [{r['plugin']}] error: {r['error']}")
            continue
        splits = ", ".join(f"{n} {s['size'] if s['size'] is not None else '?'}" for n, s in r["splits"].items())
        rewards = ", ".join(f"{n}×{w:g}" for n, w in r["rewards"].items()) or "-"
        session = f"session: {r['session']}; " if r["session"] else ""
        click.echo(f"{r['name']:<14} [{r['plugin']}] splits: {splits}; {session}tools: {', '.join(r['tools']) or '-'}; "
                   f"rewards: {rewards}")


@env.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env_show(name: str, as_json: bool) -> None:
    """One environment in full: splits, prompt, tools, rewards, parser, options and an example."""
    from toolrl.data.sources import decorate, load_split
    from toolrl.environments import get_environment
    from toolrl.plugins.parts import part_plugin

    environment = user_errors(get_environment, name, "env")
    row = _describe(name, part_plugin("environments", name), environment, count=True)
    resolved, options, _ = _with_defaults(environment)
    row.update(system_prompt=resolved.system_prompt, instructions=resolved.instructions,
               prompt_prefix=resolved.prompt_prefix, tool_entries=resolved.tools,
               parser_options=resolved.parser_options, session_options=resolved.session_options)
    split = next((n for n, s in row["splits"].items() if s["size"]), None)
    if split is not None:  # the first prompt as training sees it
        sample = load_split(resolved, split, options)[0]
        decorate(sample, resolved.system_prompt, resolved.prompt_prefix, resolved.instructions)
        row["example"] = {"split": split, "prompt": [m.to_template() for m in sample.prompt],
                          "ground_truth": sample.ground_truth}
    if as_json:
        click.echo(json.dumps(row, indent=2, default=str))
        return
    click.echo(f"{row['name']} [{row['plugin']}]: {row['description']}")
    for key in ("session", "session_options", "parser", "parser_options", "max_turns", "metric", "rewards",
                "system_prompt", "instructions"):
        if row.get(key) not in (None, {}, []):
            click.echo(f"  {key}: {row[key]}")
    click.echo("  splits: " + "; ".join(f"{n}: {s['source']} ({s['size'] if s['size'] is not None else '?'})"
                                       for n, s in row["splits"].items()))
    for entry in row["tool_entries"]:
        click.echo(f"  tool: {json.dumps(entry)}")
    for field, spec in ((row.get("options") or {}).get("properties") or {}).items():
        click.echo(f"  option {field}: default {json.dumps(spec.get('default'))}  {spec.get('description', '')}")
    if "example" in row:
        click.echo(f"  example ({row['example']['split']}), ground truth {row['example']['ground_truth']!r}:")
        for m in row["example"]["prompt"]:
            click.echo(f"    {m['role']}: {m.get('content')}")


def _counts(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """``--ladder``'s comma-separated counts, each a whole number of trajectories, at least 1."""
    counts = [x.strip() for x in value.split(",")]
    bad = next((x for x in counts if not x.isdigit() or int(x) < 1), None)
    if bad is not None:
        raise click.BadParameter(f"{bad!r} is not a count of trajectories (a whole number, at least 1)")
    return [int(x) for x in counts]


@env.command("bench")
@click.argument("name")
@click.option("--ladder", default="16,128", show_default=True, callback=_counts,
              help="Comma-separated concurrent trajectory counts.")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Steps per trajectory.")
@click.option("--think-s", default=0.1, show_default=True, type=click.FloatRange(min=0),
              help="Mean think time between a trajectory's steps (a model's generation time).")
@click.option("--split", default=None, help="The split whose samples reset the trajectories (default: the first).")
@click.option("--options", "options_json", default=None, help="JSON: the environment's options (env_options).")
@click.option("--session", default=None, help="Another session kind to drive it through (one that serves the environment's sessions).")
@click.option("--session-options", "session_json", default=None, help="JSON: that session kind's options.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env_bench(name: str, ladder: list[int], steps: int, think_s: float, split: str | None, options_json: str | None,
              session: str | None, session_json: str | None, as_json: bool) -> None:
    """Drive N concurrent trajectories of environment NAME with a scripted policy (no model), as the
    rollout drives them: throughput, p50/p99 step latency, client memory per open trajectory, errors
    by kind, trajectories masked (the environment failed) and lost."""
    import asyncio

    from toolrl.config import ConfigError
    from toolrl.testing.load import environment_driver, measure_rung

    async def rungs(counts: list[int]) -> list[Any]:
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
    click.echo(f"{'n':>6} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'KiB/traj':>9} {'done':>6} {'masked':>6} "
               f"{'lost':>5}  errors")
    for r in results:
        errors = ", ".join(f"{k} x{v}" for k, v in r.errors.items()) or "-"
        click.echo(f"{r.n:>6} {r.steps_per_s:>9.1f} {1000 * r.p50_s:>8.2f} {1000 * r.p99_s:>8.2f} "
                   f"{r.kib_per_session:>9.1f} {r.completed:>6} {r.masked:>6} {r.lost:>5}  {errors}")
