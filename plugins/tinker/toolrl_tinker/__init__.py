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
    from toolrl_tinker.commands import tinker

    cli.add_command(tinker)
