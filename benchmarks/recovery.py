"""Recovering from a lost trainer rank: from the in-memory copies vs from the last checkpoint vs a
person's ``--resume``, side by side in one run, and what keeping the copies costs each step.

A local Ray, two trainer ranks (FSDP2 over gloo), the model of ``--model`` (default: SmolLM2-135M,
fp32), AdamW, GRPO steps on a fixed batch (``--batch`` sequences of 32 prompt + ``--response``
tokens; default 4 x 64).

- **memory**: a rank is killed (SIGKILL) after a step; the group re-forms (all ranks killed, two new
  ones started) and takes the state from the copies every rank made after the step
  (``trainer.on_rank_failure: replace``, :mod:`toolrl.processes.recovery`).
- **checkpoint**: the same, with the state from the last checkpoint (DCP shards on disk) instead:
  what the group does when it has no copies (before its first step after a resume), and what
  recovering from a checkpoint costs without counting the steps it loses.
- **--resume** (the anchor): what a person's ``toolrl train ... --resume`` does before its first step:
  start the roles (two trainer ranks, one rollout worker) and load the checkpoint into them, then
  push the weights to the worker. It loses every step since the checkpoint, and waits for a person.

The per-step cost: each step is trained and its weights pushed to one rollout worker (the trainer's
part of the controller's step); the copies of a step are made beside the push and waited for by the
next step (``snapshot_wait_s``). The copy cost / step is that wait against the step's time; side by
side, the copies' own duration (``snapshot_s``: made, serialized and stored by every rank) against
it, which is what a step cost when it waited for the whole copy. Recoveries alternate between memory
and checkpoint for ``--rounds`` rounds.

    OMP_NUM_THREADS=1 python benchmarks/recovery.py [--rounds 2] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from _common import machine, median, single_thread, table

single_thread()

ROOT = Path(__file__).resolve().parents[1]


def trajectories(count: int, prompt: int, response: int, vocab: int) -> list[object]:
    """A fixed GRPO batch: random token ids below ``vocab``, rewards 0 and 1 in each group of two."""
    import random

    from toolrl.trajectory import Trajectory

    rng = random.Random(0)
    out = []
    for i in range(count):
        ids = [rng.randrange(100, vocab) for _ in range(prompt + response)]
        out.append(Trajectory(trajectory_id=str(i), sample_index=i // 2, group=i // 2, prompt_ids=ids[:prompt],
                              response_ids=ids[prompt:], response_mask=[1] * response, logprobs=[0.0] * response,
                              reward=float(i % 2)))
    return out


async def kill_and_recover(group: object, source: str, directory: str) -> float:
    """Kill rank 1, then a call (a checkpoint save) that finds it dead; the recovery's seconds."""
    if source == "checkpoint":
        group.copies, group.loaded, group.pending = None, directory, None  # as just after a resume: no copies yet
    os.kill(group.infos[1]["pid"], signal.SIGKILL)
    await group.save(tempfile.mkdtemp(prefix="recovery-bench-"), 0)
    (record,) = group.take_recoveries()
    assert record["source"].startswith(source), record
    return record["recovery_s"]


async def main_async(args: argparse.Namespace) -> None:
    import ray
    from toolrl.config import load_config
    from toolrl.processes.prepare import restore_checkpoint
    from toolrl.processes.resolve import resolve_run
    from toolrl.processes.rollout_workers import init_ray
    from toolrl.processes.start import start_processes
    from toolrl.processes.trainer_group import RayTrainerGroup
    from toolrl.run_dir import RunDir, finalize, staging_dir

    work = Path(tempfile.mkdtemp(prefix="recovery-bench-"))
    config = load_config(str(ROOT / "examples" / "tiny.yaml"), [
        f"model.source={args.model}", "ray.address=local", "trainer.world_size=2", "ray.num_rollout_workers=1",
        "tools.entries=[]", "trainer.progress=false", f"trainer.output_dir={work / 'run'}",
        f"optim.micro_batch_size={args.batch}", f"rollout.max_response_tokens={args.response}"])
    print(machine())
    init_ray("local", 3)
    processes = await start_processes(resolve_run(config, "train"))
    group = processes.trainer
    assert isinstance(group, RayTrainerGroup)
    from toolrl.model_sources import model_path

    vocab = json.loads((Path(model_path(config)) / "config.json").read_text())["vocab_size"]
    batch = trajectories(args.batch, 32, args.response, vocab)
    step_s, copy_s, wait_s = [], [], []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        out = await group.step(batch, step)
        await processes.sync_weights(step)
        if step > 1:  # the figures of the copies of the step before
            step_s.append(time.perf_counter() - t0)
            copy_s.append(out["snapshot_s"])
            wait_s.append(out["snapshot_wait_s"])
            print(f"step {step}: {step_s[-1]:.2f} s, of it waiting for the copies {wait_s[-1]:.3f} s; "
                  f"the copies took {copy_s[-1]:.3f} s", flush=True)
    run_dir = RunDir(work / "run")
    staged = staging_dir(run_dir.checkpoints, args.steps)
    await group.save(str(staged), args.steps)
    checkpoint = finalize(run_dir.checkpoints, staged, args.steps, {"world_size": 2, "data_position": 0}, keep=1)
    times: dict[str, list[float]] = {"memory": [], "checkpoint": []}
    for _ in range(args.rounds):
        for source in ("memory", "checkpoint"):
            if source == "memory":
                await group.step(batch, args.steps + 1)  # fresh copies of the group now running
                await group.save(tempfile.mkdtemp(prefix="recovery-bench-"), 0)  # waits for them
            times[source].append(await kill_and_recover(group, source, str(checkpoint)))
            print(f"recovered from {source} in {times[source][-1]:.1f} s", flush=True)
    group.close()
    await processes.rollouts.close()

    # The anchor: a new controller's start-up and restore, as `--resume` does them.
    resumed = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        run = resolve_run(config, "train")
        processes = await start_processes(run)
        try:
            await restore_checkpoint(processes, RunDir.open(work / "run", "resume"))
            resumed.append(time.perf_counter() - t0)
            print(f"--resume start-up and restore: {resumed[-1]:.1f} s", flush=True)
        finally:
            processes.trainer.close()
            await processes.rollouts.close()
    ray.shutdown()

    anchor = median(resumed)
    rows = [["in-memory copies (replace)", median(times["memory"]), median(times["memory"]) / anchor, "none"],
            ["last checkpoint", median(times["checkpoint"]), median(times["checkpoint"]) / anchor,
             "steps since the checkpoint"],
            ["a person's --resume (anchor)", anchor, 1.0, "steps since the checkpoint + the person's delay"]]
    print(table(["recovery from", f"seconds (median of {args.rounds})", "x --resume", "steps lost"], rows))
    step = median(step_s)
    print(table(["per step (median of steps 2..)", "seconds", "/ step"],
                [["step: train + weight push", step, 1.0],
                 ["the copies' duration (snapshot_s): what a step waited before", median(copy_s), median(copy_s) / step],
                 ["the step's wait for them (snapshot_wait_s)", median(wait_s), median(wait_s) / step]]))
    print(f"copy cost / step: {median(wait_s) / step:.3f} (goal <= 0.05; waiting for the whole copy: "
          f"{median(copy_s) / step:.3f})")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
