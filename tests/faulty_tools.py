"""Tools that misbehave in every way a tool can, for the fault-containment tests. Importable by module
path, so tools configs (and isolated worker processes) can name them."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from toolrl.tools import Tool


def schema(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"The {name} tool.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": False}}}


class Raises(Tool):
    schema = schema("raises")

    async def execute(self, instance_id, arguments, **kw):
        raise RuntimeError("kaboom")


class HangsAsync(Tool):
    schema = schema("hangs_async")
    default_timeout = 0.5

    async def execute(self, instance_id, arguments, **kw):
        await asyncio.sleep(3600)


class BlocksLoop(Tool):
    """A blocking call inside async def: cannot be preempted in-process."""

    schema = schema("blocks_loop")
    default_timeout = 0.5

    async def execute(self, instance_id, arguments, **kw):
        time.sleep(kw.get("block_s", 1.5))
        return "done", 0.0, {}


class IgnoresCancel(Tool):
    schema = schema("ignores_cancel")
    default_timeout = 0.5

    async def execute(self, instance_id, arguments, **kw):
        try:
            await asyncio.sleep(kw.get("sleep_s", 2.0))
        except asyncio.CancelledError:
            await asyncio.sleep(kw.get("sleep_s", 2.0))  # swallow it and carry on
        return "late", 0.0, {}


class SyncSleeps(Tool):
    """A plain def execute: runs in a thread, so the timeout holds and the loop stays free."""

    schema = schema("sync_sleeps")
    default_timeout = 0.5

    def execute(self, instance_id, arguments, **kw):
        self.state(instance_id)
        time.sleep(kw.get("sleep_s", 0.0))
        return f"slept {kw.get('sleep_s', 0.0)}", 0.0, {}


class Returns(Tool):
    """Returns whatever ``execute_kwargs['value']`` names."""

    schema = schema("returns")
    VALUES = {
        "int": 7,
        "bytes": b"raw",
        "bare_string": "no tuple",
        "pair": ("text", 1.0),
        "text_reward": ("t", "high", {}),
        "nan_reward": ("t", float("nan"), {}),
        "inf_reward": ("t", float("inf"), {}),
        "list_metrics": ("t", 0.0, [1, 2]),
        "nan_metric": ("t", 0.0, {"m": float("nan")}),
        "object_metric": ("t", 0.0, {"m": object()}),
        "int_response": (5, 0.0, {}),
    }

    async def execute(self, instance_id, arguments, **kw):
        return self.VALUES[kw["value"]]


class NanReward(Tool):
    schema = schema("nan_reward")

    async def execute(self, instance_id, arguments, **kw):
        return "fine", 0.0, {}

    async def calc_reward(self, instance_id, **kw):
        return float("nan")


class Floods(Tool):
    """Prints 1 MiB to stdout and returns 1 MiB of text."""

    schema = schema("floods")

    async def execute(self, instance_id, arguments, **kw):
        sys.stdout.write("x" * (1 << 20) + "\n")
        sys.stdout.flush()
        return "y" * (1 << 20), 0.0, {}


class Exits(Tool):
    """Kills its own process, as a segfaulting C extension would."""

    schema = schema("exits")

    async def execute(self, instance_id, arguments, **kw):
        if arguments.get("x") == 1:
            os._exit(7)
        return f"pid {os.getpid()}", 0.0, {}


class Echo(Tool):
    schema = schema("echo")

    async def execute(self, instance_id, arguments, **kw):
        self.state(instance_id)
        return f"echo {arguments.get('x')} pid {os.getpid()}", 0.5, {"pid": os.getpid()}

    async def calc_reward(self, instance_id, **kw):
        return float(self.state(instance_id).get("reward", 1.0))
