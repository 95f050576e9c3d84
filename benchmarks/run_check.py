"""What the run check costs and what it saves: `toolrl train CONFIG --check` side by side with a config
error found before torch loads, the imports the check cannot avoid, and the one-step run a bad setting
used to cost before it was refused (the model loaded, a rollout, a step).

    OMP_NUM_THREADS=1 python benchmarks/run_check.py [--runs 5] [--config examples/tiny.yaml]

Runs the commands interleaved (round-robin) so machine load hits them alike, each in a fresh process with
a temporary output directory, and prints min/median wall per command and its ratio to the one-step run.
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

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny.yaml"))
    args = ap.parse_args()
    py = sys.executable  # the venv's interpreter (its realpath would leave the venv)
    out = tempfile.mkdtemp(prefix="toolrl-bench-run-check-")
    train = [py, "-m", "toolrl", "train", args.config]
    commands = {
        "import torch": [py, "-c", "import torch"],
        "transformers' tokenizer class (what the check cannot avoid importing)": [
            py, "-c", "from transformers import PreTrainedTokenizerFast"],
        "`train` with a config error before torch (engine.name=nope)": [*train, "engine.name=nope"],
        "`train --check` (every check, nothing loaded)": [*train, "--check", f"trainer.output_dir={out}/check"],
        "`train trainer.total_steps=1` (model, rollout, one step)": [*train, "trainer.total_steps=1",
                                                                     "trainer.plot=false", "trainer.progress=false"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    times: dict[str, list[float]] = {name: [] for name in commands}
    try:
        measure(commands, times, args.runs, out, env)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    anchor = statistics.median(times["`train trainer.total_steps=1` (model, rollout, one step)"])
    print("| command | min s | median s | × one-step run |\n|---|---|---|---|")
    for name, got in times.items():
        print(f"| {name} | {min(got):.2f} | {statistics.median(got):.2f} | {statistics.median(got) / anchor:.2f} |")


def measure(commands: dict[str, list[str]], times: dict[str, list[float]], runs: int, out: str,
            env: dict[str, str]) -> None:
    for run in range(runs):
        for name, cmd in commands.items():
            if "total_steps=1" in name:
                cmd = [*cmd, f"trainer.output_dir={out}/step{run}"]
            start = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            times[name].append(time.perf_counter() - start)
            expected = 2 if "nope" in name else 0
            if done.returncode != expected:
                sys.exit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")


if __name__ == "__main__":
    main()
