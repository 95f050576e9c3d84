"""``toolrl geo3k preprocess`` and the ``toolrl-geo3k-preprocess`` console script (the same command)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group(help="Geometry3K: data preparation for the calc_geo3k_reward tool.")
def geo3k() -> None:
    pass


@geo3k.command("preprocess")
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="A geometry3k-format parquet or JSON-lines file (problem, answer, images), or a directory of them.",
)
@click.option(
    "--output-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where <split>.parquet is written.",
)
@click.option(
    "--split",
    "splits",
    multiple=True,
    default=("train",),
    show_default=True,
    help="Split name; repeat for several (a directory input picks the files named after each split).",
)
def preprocess_command(input_path: Path, output_dir: Path, splits: tuple[str, ...]) -> None:
    """Convert geometry3k rows into verl-format parquet with tools_kwargs for calc_geo3k_reward."""
    from toolrl_geo3k.preprocess import Geo3kDataError, convert, write_rows

    if input_path.is_file() and len(splits) > 1:
        raise click.UsageError("a single input file holds one split: pass --split once")
    for split in splits:
        try:
            rows = convert(input_path, split)
        except Geo3kDataError as exc:
            raise click.ClickException(str(exc)) from None
        path = write_rows(rows, output_dir, split)
        click.echo(f"{split}: {len(rows)} rows -> {path}")
