"""Weight sync, trainer to engines: bucketed from a sharded trainer against a full state-dict broadcast.

SmolLM2-135M-Instruct (fp32, 540 MB), CPU, a local Ray: two trainer ranks (FSDP2 over gloo) and two
rollout workers (transformers engine, each with its own copy of the model).

- **bucketed** (``toolrl``'s sync, ``trainer.weight_sync_bucket_mb``): every rank walks the parameters,
  gathers each shard with ``full_tensor()``, rank 0 sends a bucket at a time through the object store
  to both workers, which copy it into their engines in place.
- **broadcast** (the anchor: how weights travelled before the trainer was sharded): the full
  ``state_dict`` of a whole model in one process, put in the object store once and loaded by both
  workers (``RolloutWorkerPool.broadcast``).

Peak extra memory is the bytes a sync holds on top of the model: for bucketed, the largest
(bucket + tensor being gathered + the bucket's object-store copy) on any rank; for broadcast, the
object-store copy of the whole state dict (the model itself is not copied in the sending process on
CPU). Both are counted from the tensors, not from RSS, which the object store's shared memory and the
allocator make unreadable. Rounds alternate between the two methods.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/weight_sync.py [--rounds 3] [--bucket-mb 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from _common import machine, median, single_thread, table

single_thread()

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()

    import ray
    from toolrl.config import load_config
    from toolrl.model_sources import model_path
    from toolrl.roles.rollout_workers import RolloutWorkerPool
    from toolrl.roles.trainer_group import RayTrainerGroup
    from toolrl.training.policy import build_policy

    config = load_config(str(ROOT / "examples" / "tiny.yaml"), [
        f"model.source={args.model}", "ray.address=local", "trainer.world_size=2", "ray.num_rollout_workers=2",
        f"trainer.weight_sync_bucket_mb={args.bucket_mb}", "tools.entries=[]", "trainer.progress=false"])
    print(machine())
    path = model_path(config)
    model = build_policy(config, path, "cpu")  # the anchor's sender: a whole model in one process
    # What the broadcast puts in the object store: each storage once (pickle keeps one copy of the
    # tied embedding / LM head).
    unique = {v.untyped_storage().data_ptr(): v for v in model.state_dict().values()}
    model_mb = sum(v.numel() * v.element_size() for v in unique.values()) / 2**20
    print(f"model {path}: {model_mb:.0f} MiB of weights")

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    pool = RolloutWorkerPool(config, num_workers=2)
    group = RayTrainerGroup(config)
    loop = asyncio.new_event_loop()
    try:
        t0 = time.perf_counter()
        async def start() -> None:
            await asyncio.gather(pool.start(), group.start())

        loop.run_until_complete(start())
        print(f"2 trainer ranks and 2 rollout workers up in {time.perf_counter() - t0:.1f} s")
        rows: dict[str, list[tuple[float, float]]] = {"bucketed": [], "broadcast": []}
        for r in range(args.rounds):
            out = loop.run_until_complete(group.push(pool.workers))
            assert not out.dead
            rows["bucketed"].append((out.metrics["weight_sync_s"], out.metrics["weight_sync_peak_mb"]))
            t0 = time.perf_counter()
            loop.run_until_complete(pool.broadcast(model.state_dict()))
            rows["broadcast"].append((time.perf_counter() - t0, model_mb))
            print(f"round {r + 1}: bucketed {rows['bucketed'][-1][0]:.2f} s, broadcast {rows['broadcast'][-1][0]:.2f} s",
                  flush=True)
    finally:
        group.close()
        loop.run_until_complete(pool.close())
        loop.close()
        ray.shutdown()

    sync = {k: median([s for s, _ in v]) for k, v in rows.items()}
    peak = {k: max(p for _, p in v) for k, v in rows.items()}
    print()
    print(table(["method", "sync s (median)", "peak extra MiB", "× broadcast time", "× broadcast memory"], [
        [f"bucketed ({args.bucket_mb:g} MB buckets, 2 FSDP ranks)", sync["bucketed"], peak["bucketed"],
         sync["bucketed"] / sync["broadcast"], peak["bucketed"] / peak["broadcast"]],
        ["full state_dict broadcast (1 process)", sync["broadcast"], peak["broadcast"], 1.0, 1.0],
    ]))


if __name__ == "__main__":
    main()
