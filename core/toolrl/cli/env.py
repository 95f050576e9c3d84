"""``toolrl env list`` and ``show``: the installed environments (a plugin's ``register_commands`` may add
more to the group: the fleet's ``serve`` and ``bench``). Light at import (click only); listing imports the
environments' modules and generates their splits, never torch."""

from __future__ import annotations

import json
from typing import Any

import click

from toolrl.cli.errors import user_errors


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
