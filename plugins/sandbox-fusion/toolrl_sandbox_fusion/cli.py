"""``toolrl sandbox ...`` commands. Only click is imported here; the server loads when it runs."""

from __future__ import annotations

import click


@click.group("sandbox")
def sandbox() -> None:
    """The embedded code sandbox."""


@sandbox.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind; 0 picks a free one (the address is printed).")
@click.option("--isolation", type=click.Choice(["auto", "bwrap", "unshare"]), default="auto", show_default=True,
              help="auto: bubblewrap when it works here, else the unshare fallback (with a warning).")
@click.option("--python-executable", default=None, type=click.Path(exists=True, dir_okay=True),
              help="The Python the code runs on (an executable, or a venv/prefix folder), mounted "
                   "read-only in the sandbox. Default: /usr/bin/python3.")
@click.option("--workers", default=8, show_default=True, type=click.IntRange(1), help="Runs at once.")
@click.option("--pool-size", default=4, show_default=True, type=click.IntRange(1),
              help="Sandbox processes kept started and waiting.")
@click.option("--max-memory-mb", default=None, type=click.IntRange(1),
              help="The most memory any run gets, also one whose request says memory_limit_MB -1. "
                   "Default: the request decides (-1: no limit, as SandboxFusion; none named: 1024 MB).")
def serve(host: str, port: int, isolation: str, python_executable: str | None, workers: int, pool_size: int,
          max_memory_mb: int | None) -> None:
    """Serve a SandboxFusion-compatible API (POST /run_code, GET /v1/ping) on the embedded sandbox."""
    from toolrl_sandbox_fusion.embedded import SandboxConfig, SandboxLimits
    from toolrl_sandbox_fusion.server import serve as run_server

    try:
        run_server(host, port, SandboxConfig(isolation=isolation, max_concurrency=workers,  # type: ignore[arg-type]
                                             pool_size=pool_size, interpreter=python_executable,
                                             limits=SandboxLimits(max_memory_mb=max_memory_mb)))
    except (OSError, RuntimeError) as exc:  # port in use, bwrap requested but unusable
        raise click.ClickException(str(exc)) from None
