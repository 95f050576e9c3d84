"""Helpers for the openai plugin's tests: ``toolrl serve`` as a real subprocess on a free loopback
port, a scripted engine installed as a real plugin distribution (so the served process finds it
through entry points), and a small in-process OpenAI-style server that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
TINY_YAML = REPO / "examples" / "tiny.yaml"

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
# Qwen3's template renders the last assistant turn with a (here empty) reasoning block.
ANSWER = "<think>\n\n</think>\n\nThe answer is 5."

# Stands in for a model that emits a tool call and then answers: the k-th assistant turn of a
# conversation (counted in the rendered prompt) is script[k], ended with the end-of-turn token even when
# cut short for it, every position its own logprob. The tokenizer, chat template, parser, server and
# client around it are real.
SCRIPTED_ENGINE = '''
from toolrl import hookimpl
from toolrl.engines import Generation
from toolrl.testing import ScriptedEngine


class ChatScript(ScriptedEngine):
    name = "chat_script"

    def text(self, session_id, prompt_ids):
        turn = self.tokenizer.decode(prompt_ids, skip_special_tokens=False).count("<|im_start|>assistant") - 1
        return self.script[min(turn, len(self.script) - 1)]

    def generation(self, text, params):
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: params.max_new_tokens - 1]
        ids.append(params.stop_token_ids[0])
        return Generation(ids, [-0.25 - 0.01 * i for i in range(len(ids))], "stop", params.stop_token_ids[0])


@hookimpl
def register_rollout_engines(register):
    register(ChatScript)
'''


def make_plugin_dist(root: Path, dist: str, module: str, code: str) -> Path:
    """An unpacked distribution with a ``toolrl`` entry point: on PYTHONPATH, it is a plugin."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[toolrl]\n{module} = {module}\n")
    return root


def write_config(path: Path, overrides: dict[str, Any]) -> Path:
    config = yaml.safe_load(TINY_YAML.read_text())
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config))
    return path


def env_with(pythonpath: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return env


def toolrl(*args: str) -> Any:
    """Run a ``toolrl`` command in this process (the CLI's own code path, without a second Python
    start-up importing torch again); returns click's result (exit_code, stdout, stderr)."""
    from click.testing import CliRunner
    from toolrl.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


class ServeProcess:
    """``toolrl serve CONFIG --port 0 ...`` started in the background; ``wait()`` reads its URL from
    the line it prints once listening (start several, then wait: their start-ups overlap)."""

    def __init__(self, config: Path, *args: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._log_file = log.open("w")
        # Ctrl-C (interrupt) as in a terminal: a parallel test runner (nox --parallel) may start us with
        # SIGINT ignored, which a child inherits, and a Python started so never raises KeyboardInterrupt.
        self.proc = subprocess.Popen([sys.executable, "-m", "toolrl", "serve", str(config), "--port", "0", *args],
                                     stdout=self._log_file, stderr=subprocess.STDOUT, env=env or env_with(),
                                     cwd=REPO, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.url = ""
        self.record = Path(args[args.index("--record") + 1]) if "--record" in args else None

    def wait(self, timeout: float = 180) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"serving \S+ at (http://\S+/v1)", self.log.read_text())
            if m:
                self.url = m.group(1)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"toolrl serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"toolrl serve did not start:\n{self.log.read_text()}")

    def interrupt(self) -> None:
        """Ctrl-C: a graceful shutdown (open conversations are recorded)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def stop(self) -> int:
        """Interrupt and wait; killed if it hangs."""
        if self.proc.poll() is None:
            self.interrupt()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
        return self.proc.returncode


def recorded(server: ServeProcess, expect: int, predicate: Callable[[dict[str, Any]], bool] = lambda r: True,
             timeout: float = 60) -> list[dict[str, Any]]:
    """The server's recorded rows that satisfy ``predicate``, once there are ``expect`` of them
    (conversations are written when they go idle)."""
    assert server.record is not None
    path = server.record / "trajectories.jsonl"
    deadline = time.monotonic() + timeout
    while True:
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        rows = [r for r in rows if predicate(r)]
        if len(rows) >= expect or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def rollout_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "rollouts" / "step_00001.jsonl").read_text().splitlines()]


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


Handler = Callable[[int, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


class FakeServer:
    """An OpenAI-style server in a background thread whose /v1/completions answers come from
    ``handler(call_number, body)``; records every request body and the most requests in flight."""

    def __init__(self, handler: Handler, models: tuple[str, ...] = ("hosted-model",)) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route
        from toolrl_openai.server import bind

        self.bodies: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0

        async def list_models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                                             "owned_by": "test"} for m in models]})

        async def completions(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            self.bodies.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                status, payload = await handler(len(self.bodies), body)
            finally:
                self.in_flight -= 1
            return JSONResponse(payload, status_code=status)

        app = Starlette(routes=[Route("/v1/models", list_models), Route("/v1/completions", completions,
                                                                       methods=["POST"])])
        self._sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def text_completion(text: str, finish: str = "stop") -> dict[str, Any]:
    """A hosted API's answer: text, no token ids, no logprobs."""
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "hosted-model",
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
