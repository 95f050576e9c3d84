"""`toolrl list-plugins` start-up time, side by side with `python -c pass` and a bare entry-point scan.

    OMP_NUM_THREADS=1 python benchmarks/cli_startup.py [--runs 25]

Runs the commands interleaved (round-robin) so machine load hits them alike, prints min/median wall
per command, the ratio to the bare scan, and whether `-X importtime` shows any heavy library.
`toolrl list-plugins` runs with a warm plugin-screening cache (the usual case: the verdict for the
installed plugins is cached) and, as "cold", with an empty cache each time (the first command after
installing, upgrading or editing a plugin: external plugins are screened in a child process first).
Both use a temporary `TOOLRL_CACHE`, so the user's cache is neither used nor changed.
Goal: warm median ≤ 150 ms with every first-party plugin installed (`llm plugins`: 590-667 ms here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "transformers", "ray", "vllm", "mcp", "httpx", "pydantic", "jsonschema", "math_verify")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=25)
    args = ap.parse_args()
    py = os.path.realpath(sys.executable)
    # The console script of this interpreter's environment (the venv need not be activated).
    toolrl = str(Path(sys.executable).parent / "toolrl")
    if not os.path.exists(toolrl):
        toolrl = shutil.which("toolrl") or "toolrl"
    cache = tempfile.mkdtemp(prefix="toolrl-bench-cache-")
    warm = {**os.environ, "TOOLRL_CACHE": cache}
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "bare entry-point scan": [py, "-c", "import importlib.metadata as m; m.entry_points(group='toolrl')"],
        "toolrl list-plugins": [toolrl, "list-plugins"],
        "toolrl list-plugins --json": [toolrl, "list-plugins", "--json"],
        "list-plugins, cold cache": [toolrl, "list-plugins"],
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    for cmd in commands.values():  # warm the page cache, bytecode and the screening verdict
        subprocess.run(cmd, capture_output=True, check=True, env=warm)
    for _ in range(args.runs):
        for name, cmd in commands.items():
            env = {**os.environ, "TOOLRL_CACHE": tempfile.mkdtemp(dir=cache)} if "cold" in name else warm
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, env=env)
            times[name].append(time.perf_counter() - t)
    scan = statistics.median(times["bare entry-point scan"])
    print(f"{'command':<28} {'min ms':>8} {'median ms':>10} {'x scan':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<28} {min(ts) * 1e3:8.1f} {med * 1e3:10.1f} {med / scan:7.2f}")
    plugins = subprocess.run([toolrl, "list-plugins"], capture_output=True, text=True, env=warm).stdout
    print(f"plugins loaded: {len(plugins.splitlines())} lines of listing")
    trace = subprocess.run([toolrl, "list-plugins"], capture_output=True, text=True,
                           env={**warm, "PYTHONPROFILEIMPORTTIME": "1"}).stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in trace.splitlines() if "|" in line}
    shutil.rmtree(cache)
    heavy = sorted(set(HEAVY) & imported)
    print(f"heavy imports in `toolrl list-plugins`: {', '.join(heavy) or 'none'}")
    median = statistics.median(times["toolrl list-plugins"]) * 1e3
    print(f"ratio toolrl list-plugins / goal 150 ms: {median / 150:.2f}  (llm plugins anchor: 590-667 ms)")


if __name__ == "__main__":
    main()
