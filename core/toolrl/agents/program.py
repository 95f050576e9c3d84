"""The ``command`` agent: a program started once per episode, its endpoint in its environment.

``rollout.agent: {command: "python my_agent.py", env: {...}, cwd: DIR, timeout_s: 600}``. The
program reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (what every OpenAI client reads), the data
row as JSON from ``TOOLRL_TASK``, and POSTs ``{"reward": x}`` to ``TOOLRL_REWARD_URL`` when it knows
how it did. A non-zero exit is a failed episode; its stderr's last lines say why.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from toolrl.agents import Agent, AgentFailure, AgentOptions, AgentTask, Endpoint

if TYPE_CHECKING:
    from toolrl.plugins.parts import RunFacts

STDERR_TAIL = 2000  # characters of a failed program's stderr kept in its trajectory's error


class CommandOptions(AgentOptions):
    command: str | list[str] = Field(description="the program and its arguments (a string is split as a shell would)")
    env: dict[str, str] = Field(default_factory=dict, description="more environment variables")
    cwd: str | None = None

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if not (shlex.split(value) if isinstance(value, str) else value):
            raise ValueError("names no program")
        return value


class CommandAgent(Agent):
    name = "command"
    Options = CommandOptions

    def argv(self) -> list[str]:
        """The command; a leading ``python`` is this interpreter (the run's environment, not a shim's)."""
        options: Any = self.options
        argv = shlex.split(options.command) if isinstance(options.command, str) else list(options.command)
        return [sys.executable, *argv[1:]] if argv[0] in ("python", "python3") else argv

    async def run(self, task: AgentTask, endpoint: Endpoint) -> float | None:
        options: Any = self.options
        env = {**os.environ, **options.env, **endpoint.environ(), "TOOLRL_TASK": task.model_dump_json()}
        proc = await asyncio.create_subprocess_exec(*self.argv(), env=env, cwd=options.cwd,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            _, err = await proc.communicate()
        except BaseException:  # cancelled (the episode's deadline): the program goes with it
            if proc.returncode is None:
                proc.kill()
                await asyncio.shield(proc.wait())
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-STDERR_TAIL:].strip()
            raise AgentFailure(f"{self.argv()[-1]} exited with {proc.returncode}" + (f": {tail}" if tail else ""))
        return None

    def check_run(self, facts: RunFacts) -> list[str]:
        options: Any = self.options
        if options.cwd is not None and not Path(options.cwd).is_dir():
            raise ValueError(f"cwd: {options.cwd} is not a directory")
        program, *args = self.argv()
        if os.sep not in program and not any(Path(d, program).exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
            raise ValueError(f"command: {program!r} is not on PATH")
        found = Path(options.cwd or ".", program)  # a path: as the program is started, from cwd
        if os.sep in program and not (found.is_file() and os.access(found, os.X_OK)):
            where = "" if found.is_absolute() else f" (in {Path(options.cwd or '.').resolve()})"
            raise ValueError(f"command: {program} " + ("is not an executable file" if found.exists() else
                                                        "does not exist") + where)
        if program == sys.executable and args and not args[0].startswith("-") and not Path(options.cwd or ".", args[0]).is_file():
            raise ValueError(f"command: the program {args[0]} does not exist (in {Path(options.cwd or '.').resolve()})")
        return super().check_run(facts)
