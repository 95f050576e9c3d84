"""Environments at scale: any session kind served by environment servers (``toolrl env serve``,
:mod:`toolrl_fleet.server`) and used through the ``fleet`` session kind (:mod:`toolrl_fleet.remote`),
each trajectory on one server of a fleet; ``toolrl env bench`` (:mod:`toolrl_fleet.load`) measures how
many sessions an environment holds. Light at import (click only): every ``toolrl`` invocation runs
:func:`register_commands`."""

from __future__ import annotations

import click
from toolrl import hookimpl
from toolrl.hookspecs import Register


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_fleet.remote:FleetSession", name="fleet")


@hookimpl
def register_commands(cli: click.Group) -> None:
    from toolrl_fleet.cli import env_bench, env_serve

    env = cli.commands.get("env")
    if not isinstance(env, click.Group):  # a command group without the core's `env` (the plugin screening's)
        env = click.Group("env")
        cli.add_command(env)
    env.add_command(env_serve)
    env.add_command(env_bench)
