"""A broadcast weight sync on Ray that finds a rollout worker dead. (A run trained over ``broadcast`` with
delta syncs to the object store's figures: tests/test_sharded_training.py, beside the two-rank run it
compares with.)"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")


@pytest.mark.long  # about 2.5 minutes; the default run covers broadcast (test_sharded_training) and replacement (test_async_ray)
def test_a_worker_lost_before_a_broadcast_sync_is_replaced_and_gets_the_weights(monkeypatch):
    """A rollout worker dead when a broadcast sync starts: its links fail within
    ``trainer.weight_push_timeout_s`` (no hang), the sync goes again to the live worker on new links,
    the dead one is replaced, and the replacement gets the weights and their version over the
    transport from the live worker (its peer, which holds them), not from the trainer: bit for bit."""
    import asyncio
    import time

    import ray
    import torch
    from ray.exceptions import RayActorError
    from toolrl.config import load_config
    from toolrl.processes import sync_weights
    from toolrl.processes.rollout_workers import RolloutWorkerPool
    from toolrl.processes.trainer_group import RayTrainerGroup
    from toolrl.ray_cluster import init_ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    config = load_config(TINY, ["ray.address=local", "ray.num_rollout_workers=2", "trainer.world_size=1",
                                "trainer.weight_transport=broadcast", "trainer.weight_push_timeout_s=10",
                                "tools.entries=[]", "trainer.progress=false"])
    # CPUs for two workers and a trainer rank (the pool alone would start Ray with what it needs).
    init_ray("local", 4, num_cpus=4, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    pool = RolloutWorkerPool(config, num_workers=2)
    loop = asyncio.new_event_loop()
    group = None
    try:
        loop.run_until_complete(pool.start())
        group = RayTrainerGroup(config)
        loop.run_until_complete(group.start())
        pool.slots.weights_from = group
        loop.run_until_complete(sync_weights(group, pool, 1))
        assert [ray.get(w.ping.remote())["weight_version"] for w in pool.workers] == [1, 1]

        victim = pool.workers[1]
        ray.kill(victim, no_restart=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                ray.get(victim.ping.remote())
            except RayActorError:
                break
            time.sleep(0.2)
        restarts, t0 = pool.slots.restarts, time.monotonic()
        sync = loop.run_until_complete(sync_weights(group, pool, 2))
        assert time.monotonic() - t0 < 10 + 60, "the failed transfer was not ended by its timeout"
        assert sync["weight_sync_s"] > 0 and pool.slots.restarts == restarts + 1 and pool.workers[1] is not victim
        loop.run_until_complete(pool.ready())  # the replacement up, with the trainer's weights
        assert [ray.get(w.ping.remote())["weight_version"] for w in pool.workers] == [2, 2]
        # ... from its live peer (at version 2), not from the trainer, bit for bit.
        (row,) = [r for r in pool.take_recoveries() if r["index"] == 1]
        assert row["source"] == "peer worker 0 (version 2, broadcast)", row
        def engine_weights(worker) -> dict:  # on the worker (defined here: pickled by value)
            return {k: v.clone() for k, v in worker._rollouts.engine.weight_tensors().items()}

        peer, new = (ray.get(w.__ray_call__.remote(engine_weights)) for w in pool.workers)
        assert peer.keys() == new.keys() and all(torch.equal(peer[k], new[k]) for k in peer)
    finally:
        if group is not None:
            group.close()
        loop.run_until_complete(pool.close())
        loop.close()
        ray.shutdown()
