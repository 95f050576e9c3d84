"""Per-call cost of the guarded tool path, against calling ``execute`` directly.

Rollouts never call ``execute`` directly: :meth:`toolrl.tools.Tool.call` validates the arguments,
runs execute under a hard deadline with every coroutine step timed (the event-loop watchdog) and
checks the return value; with ``isolation: process`` the call also crosses into a worker process.
This measures, side by side in one run, on the calculator tool (``1+2*3``):

- anchor: ``await tool.execute(iid, args)``, nothing else;
- ``Tool.call`` in-process (what every rollout call costs);
- ``Tool.call`` with ``isolation: process`` (pickled round trip over a socket to the worker).

    OMP_NUM_THREADS=1 python benchmarks/tool_call_overhead.py [--calls 2000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from typing import Any  # noqa: E402

from _common import machine, table  # noqa: E402

ARGS = {"expression": "1+2*3"}


async def sample(fn: Callable[[], Awaitable[Any]], calls: int) -> list[float]:
    for _ in range(min(50, calls)):  # warm-up
        await fn()
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - start) * 1e6)
    return out


async def main(calls: int) -> None:
    from toolrl.tools.isolation import ProcessTool
    from toolrl_calculator.tool import CalculatorTool

    plain = CalculatorTool()
    isolated = await ProcessTool.start(CalculatorTool, {"isolation": "process"}, None)
    try:
        plain_iid, isolated_iid = await plain.create(), await isolated.create()
        direct = await sample(lambda: plain.execute(plain_iid, ARGS), calls)
        guarded = await sample(lambda: plain.call(plain_iid, ARGS), calls)
        remote = await sample(lambda: isolated.call(isolated_iid, ARGS), calls)
        assert (await isolated.call(isolated_iid, ARGS)).response.text == "7"
    finally:
        await isolated.close()
    anchor = statistics.median(direct)
    rows = [(label, statistics.median(s), sorted(s)[int(0.95 * (len(s) - 1))], statistics.median(s) / anchor)
            for label, s in (("execute() directly (anchor)", direct), ("Tool.call, in-process", guarded),
                             ("Tool.call, isolation: process", remote))]
    print(machine())
    print(f"{calls} calls each, calculator '1+2*3'; microseconds per call")
    print(table(("path", "p50 µs", "p95 µs", "× anchor"), rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
