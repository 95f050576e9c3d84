"""OpenEnv servers the plugin starts itself (``openenv.app``): one subprocess per (app, directory),
shared by every route that names it, on a free loopback port, stopped when its last user closes and at
interpreter exit; the child also exits by itself when this process dies (see :mod:`toolrl_openenv.serve`)."""

from __future__ import annotations

import asyncio
import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from toolrl.plugin_support import stop_child

from toolrl_openenv.config import ServerConfigError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """One started server process and the routes that use it."""

    def __init__(self, app: str, app_dir: Path | None) -> None:
        self.app, self.app_dir = app, app_dir
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.users = 0
        self.process: subprocess.Popen | None = None
        # A file, not a pipe: a chatty server never blocks on it. Closed with the object.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        self.ready: asyncio.Future[None] | None = None

    def spawn(self) -> None:
        env = dict(os.environ)
        if self.app_dir is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.app_dir), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolrl_openenv.serve", self.app, str(self.port)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.log,
            cwd=self.app_dir, env=env, start_new_session=True,  # Ctrl-C reaches us; we stop it
        )

    async def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    self.log.seek(0)
                    err = self.log.read().decode(errors="replace")
                    tail = " | ".join(err.strip().splitlines()[-3:]) or "no output"
                    raise ServerConfigError(f"OpenEnv server {self.app!r} exited with code "
                                          f"{self.process.returncode} while starting: {tail}")
                try:
                    if (await client.get(f"{self.base_url}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        self.stop()
        raise ServerConfigError(f"OpenEnv server {self.app!r} did not answer {self.base_url}/health within "
                              f"{timeout_s:g} s (openenv.startup_timeout_s)")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_child(process)


_SERVERS: dict[tuple[str, str], LocalServer] = {}


async def acquire(app: str, app_dir: Path | None, startup_timeout_s: float) -> LocalServer:
    """The running server for ``app`` (started on first use); pair with :func:`release`."""
    key = (app, str(app_dir.resolve()) if app_dir else "")
    server = _SERVERS.get(key)
    if server is None:
        server = _SERVERS[key] = LocalServer(app, app_dir)
        server.spawn()
        server.ready = asyncio.ensure_future(server.wait_healthy(startup_timeout_s))
    server.users += 1
    assert server.ready is not None
    try:
        await asyncio.shield(server.ready)
    except BaseException:
        release(server)
        raise
    return server


def release(server: LocalServer) -> None:
    server.users -= 1
    if server.users <= 0:
        server.stop()
        key = next((k for k, s in _SERVERS.items() if s is server), None)
        if key is not None:
            del _SERVERS[key]


@atexit.register
def _stop_all() -> None:
    for server in list(_SERVERS.values()):
        server.stop()
    _SERVERS.clear()
