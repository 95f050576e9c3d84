"""A server the plugin started never outlives the run: not after a normal close, nor when the run
is killed (SIGKILL: no atexit, no finally) or interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
from support import ENVS

# Ctrl-C as in a terminal: a parallel test runner (nox --parallel) may start its sessions with SIGINT
# ignored, and a Python started so never raises KeyboardInterrupt.
PARENT = textwrap.dedent(f"""
    import asyncio, signal, sys, time
    from pathlib import Path
    from toolrl_openenv import server
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def main():
        local = await server.acquire("tiny_app:app", Path({str(ENVS)!r}), 120)
        print(local.base_url, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_the_server_stops_when_the_run_dies(sig: signal.Signals) -> None:
    run = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        url = run.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and answers(url)
        os.kill(run.pid, sig)
        run.wait(timeout=60)
        deadline = time.monotonic() + 30
        while answers(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not answers(url), f"the server outlived the run ({sig.name})"
    finally:
        run.kill()
        run.wait()
