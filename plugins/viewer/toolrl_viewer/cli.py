"""``toolrl view RUN_DIR [RUN_DIR ...] [--port P]``."""

from __future__ import annotations

from pathlib import Path

import click

WHAT = ("config.json", "metrics.jsonl", "rollouts", "results.jsonl", "summary.json")


@click.command("view")
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: any free port).")
def view(run_dirs: tuple[Path, ...], port: int) -> None:
    """Serve a page on 127.0.0.1 showing training runs (metrics over steps, overlaid; trajectories turn by
    turn) and evaluations from `toolrl eval --output` (two side by side). A run still being written
    gains its new steps on the page. Nothing is fetched or sent anywhere."""
    for path in run_dirs:
        if not any((path / name).exists() for name in WHAT):
            raise click.BadParameter(f"{path} holds no run (none of {', '.join(WHAT)})", param_hint="RUN_DIR")
    from toolrl_viewer.server import serve

    try:
        server = serve(list(run_dirs), port)
    except OSError as exc:
        raise click.ClickException(f"--port {port}: {exc.strerror or exc}") from None
    click.echo(f"toolrl view: http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)", err=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
