"""toolrl plugin: ``toolrl view RUN_DIR [RUN_DIR ...]``, a page on 127.0.0.1 showing runs' metrics over
steps (overlaid), their trajectories turn by turn (paged from disk through a byte-offset index) and two
evaluations side by side, updated while a run is still being written.

This module is the plugin's entry point: it registers the command only; the server, plotly's files
and the tokenizer are loaded when the command runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrl import hookimpl

if TYPE_CHECKING:
    import click

__version__ = "0.1.0"


@hookimpl
def register_commands(cli: click.Group) -> None:
    from toolrl_viewer.cli import view

    cli.add_command(view)
