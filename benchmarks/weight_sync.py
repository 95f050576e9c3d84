"""Weight sync, trainer to engines, over every weight transport side by side, and the memcpy floor.

Two trainer ranks (FSDP2 over gloo) and two rollout workers (transformers engine, each with its own copy
of the model) on a local Ray, CPU, fp32; per model, rounds alternate between the transports on the same
actors (``RayTrainerGroup.transport`` switched between pushes):

- **object_store** (the default; the anchor): each rank puts the packed buckets of the rows it owns in
  Ray's object store, a bucket at a time (two in flight), and both workers read them there and write
  them into the engine in place.
- **broadcast**: each rank sends the rows it owns over its own gloo group to both workers, packed
  buckets, the next packed while one travels; workers write them into the engine in place.
- **shared_memory**: the same, through two ``/dev/shm`` segments per rank the workers map.
- **disk**: the same, one safetensors file per bucket under a temporary directory.
- **memcpy floor**: the same bytes copied once with ``Tensor.copy_`` in this process, one thread.
- **bare gloo broadcast**: the same bytes broadcast by gloo alone, two sender processes (half each) to
  two receivers, as ``broadcast`` moves them: what the wire itself costs on this machine (loopback TCP,
  each byte copied into and out of the kernel once per receiver).

On the first model also (``--no-extra`` leaves them out):

- **delta** (``trainer.weight_sync: delta``) over each transport: between two syncs every tensor but
  the (tied) embeddings is written in place, as a step with frozen embeddings writes them; only those
  travel.
- **nothing to send** over object_store, broadcast and shared_memory: a delta sync after no write, so
  no weight travels: what a sync costs besides its bytes (the calls, the links' handshakes, the workers
  holding decoding), the floor under an adapter-only sync.
- **lora adapter-only**: a LoRA run (``model.lora``: r 8, all-linear) on actors of its own; only the
  adapters travel, and the workers' engines hold the same adapters on their base model.

Each timed sync follows an untimed one on the same transport (a new transport opens new links).

Sync seconds: the slowest rank's, as the controller's ``weight_sync_s``. Peak extra MiB: the most a
rank holds for the sync beyond its shard (every transport: its two bucket buffers), counted from the
tensors.
Models: SmolLM2-135M-Instruct (``smollm2``) and a random model shaped like Qwen2.5-0.5B (``qwen0.5b``:
hidden 896, 24 layers, 14/2 heads, MLP 4864, tied 151936-row vocab; built once into the cache).
The last lines are the first model's ``lora adapter-only/full`` (object_store both; then over
broadcast both, over shared_memory both, and adapter-only over broadcast against the full
object_store sync), ``broadcast/bare gloo broadcast``, ``broadcast/object_store`` and
``shared_memory/object_store`` (medians of the rounds).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/weight_sync.py [--rounds 3] [--bucket-mb 64] [--models smollm2,qwen0.5b] [--no-extra]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, median, single_thread, table

single_thread()

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = ("object_store", "broadcast", "shared_memory", "disk")
QWEN_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                intermediate_size=4864)


def source(name: str) -> str:
    if name == "smollm2":
        return "smollm2-135m-instruct"
    from toolrl.model_sources import tiny_qwen3

    return tiny_qwen3(**QWEN_05B)


def memcpy_s(nbytes: int, rounds: int) -> float:
    """The floor: ``nbytes`` copied once, one thread (median of ``rounds``)."""
    import torch

    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return median(times)


def _bare_broadcast(rank: int, port: int, nbytes: int, rounds: int, out: str) -> None:
    """One of four processes: ranks 0 and 1 each broadcast half of ``nbytes`` over a gloo group of
    their own to ranks 2 and 3, which take both at once (the broadcast transport's topology, nothing
    else: no packing, no loading)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    groups = [dist.new_group([0, 2, 3]), dist.new_group([1, 2, 3])]
    halves = [torch.ones(nbytes // 2, dtype=torch.uint8) for _ in groups]
    times = []
    for _ in range(rounds + 1):  # the first connects the pairs: untimed
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.broadcast(halves[i], src=i, group=group, async_op=True) for i, group in enumerate(groups)
                 if rank in (i, 2, 3)]  # sender i, and both receivers
        for work in works:
            work.wait()
        times.append(time.perf_counter() - t0)
    took = torch.tensor([median(times[1:])], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(str(float(took)))
    dist.destroy_process_group()


def bare_broadcast_s(nbytes: int, rounds: int) -> float:
    """The wire's own cost here: ``nbytes`` broadcast by bare gloo, two senders (half each) to two
    receivers in four processes, as the ``broadcast`` transport moves them (median of ``rounds``)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s, tempfile.TemporaryDirectory() as tmp:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        out = str(Path(tmp) / "took")
        mp.spawn(_bare_broadcast, args=(port, nbytes, rounds, out), nprocs=4)
        return float(Path(out).read_text())


def _set_delta(rank: Any, on: bool) -> None:
    """On a trainer rank (``__ray_call__``): delta sync turned on (its receivers' state empty: the next
    sync sends everything) or off."""
    from dataclasses import replace

    from toolrl.training.weight_sync import Delta

    if (rank.delta is not None) != on:
        rank.sync_plan = replace(rank.sync_plan, delta=on)
        rank.delta = Delta() if on else None


def _write_all_but_embeddings(rank: Any) -> None:
    """On a trainer rank: every parameter but the embeddings written in place (values unchanged)."""
    import torch

    with torch.no_grad():
        for name, p in rank.model.named_parameters():
            if "embed_tokens" not in name:
                p.mul_(1.0)


def measure(model: str, rounds: int, bucket_mb: float, scratch: str, extra: bool) -> dict[str, Any]:
    import ray
    from toolrl.model_sources import load_model

    config = _config(model, bucket_mb)
    weights = load_model(config[1])
    unique = {v.untyped_storage().data_ptr(): v for v in weights.state_dict().values()}  # tied: once
    nbytes = sum(v.numel() * v.element_size() for v in unique.values())
    del weights, unique
    print(f"model {config[1]}: {nbytes / 2**20:.0f} MiB of weights", flush=True)
    transports = _transports(scratch)

    def full(group: Any) -> None:
        ray.get([r.__ray_call__.remote(_set_delta, False) for r in group.ranks])

    def delta(group: Any) -> None:
        ray.get([r.__ray_call__.remote(_set_delta, True) for r in group.ranks])
        ray.get([r.__ray_call__.remote(_write_all_but_embeddings) for r in group.ranks])

    def nothing(group: Any) -> None:  # delta with nothing written: the sync's own cost, no weight travels
        ray.get([r.__ray_call__.remote(_set_delta, True) for r in group.ranks])

    # Full and delta syncs on the same actors; delta's untimed first sync (new links) sends everything.
    plans = {name: (t, full) for name, t in transports.items()}
    if extra:
        plans |= {f"delta {name}": (t, delta) for name, t in transports.items()}
        plans |= {f"nothing to send {name}": (transports[name], nothing)
                  for name in ("object_store", "broadcast", "shared_memory")}
    rows = _rounds(config[0], plans, rounds)
    if extra:
        lora = _config(model, bucket_mb, "model.lora={r: 8, alpha: 16}")[0]
        rows |= {f"lora adapter-only {n}": v for n, v in _rounds(
            lora, {n: (transports[n], None) for n in ("object_store", "broadcast", "shared_memory")}, rounds).items()}
    return {"sync": {k: median([s for s, _ in v]) for k, v in rows.items()},
            "peak": {k: max(p for _, p in v) for k, v in rows.items()},
            "floor": memcpy_s(nbytes, max(3, rounds)), "gloo": bare_broadcast_s(nbytes, max(3, rounds)),
            "mib": nbytes / 2**20}


def _config(model: str, bucket_mb: float, *overrides: str) -> tuple[Any, str]:
    from toolrl.config import load_config
    from toolrl.model_sources import model_path

    config = load_config(str(ROOT / "examples" / "tiny.yaml"), [
        f"model.source={source(model)}", "ray.address=local", "trainer.world_size=2", "ray.num_rollout_workers=2",
        f"trainer.weight_sync_bucket_mb={bucket_mb}", "tools.entries=[]", "trainer.progress=false", *overrides])
    return config, model_path(config)


def _transports(scratch: str) -> dict[str, Any]:
    from toolrl.plugins.parts import BuildContext, build_part

    options = {"disk": {"path": scratch}}
    return {name: build_part("weight_transports", name, options.get(name), BuildContext(name)) for name in TRANSPORTS}


def _rounds(config: Any, transports: dict[str, tuple[Any, Any]], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """``rounds`` timed syncs per transport on one set of actors (2 ranks, 2 workers), alternating
    between the transports; ``transports``: name -> (transport, what to run on the group before each
    sync, or None)."""
    from toolrl.processes.rollout_workers import RolloutWorkerPool
    from toolrl.processes.trainer_group import RayTrainerGroup

    pool = RolloutWorkerPool(config, num_workers=2)
    group = RayTrainerGroup(config)
    loop = asyncio.new_event_loop()
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in transports}
    version = 0
    try:
        t0 = time.perf_counter()

        async def start() -> None:
            await asyncio.gather(pool.start(), group.start())

        loop.run_until_complete(start())
        print(f"2 trainer ranks and 2 rollout workers up in {time.perf_counter() - t0:.1f} s", flush=True)
        for r in range(rounds):
            for name, (transport, before) in transports.items():
                group.transport = transport
                for _ in range(2):  # the first opens the transport's links: untimed
                    if before is not None:
                        before(group)
                    version += 1
                    out = loop.run_until_complete(group.push(pool.workers, version))
                    assert not out.dead, f"{name}: workers lost"
                rows[name].append((out.metrics["weight_sync_s"], out.metrics["weight_sync_peak_mb"]))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s" for k, v in rows.items()), flush=True)
    finally:
        group.close()
        loop.run_until_complete(pool.close())
        loop.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--models", default="smollm2,qwen0.5b")
    parser.add_argument("--no-extra", action="store_true", help="leave out the delta and LoRA rows")
    args = parser.parse_args()

    import ray

    print(machine())
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="toolrl-weights-") as scratch:
            for i, model in enumerate(args.models.split(",")):
                results[model] = measure(model, args.rounds, args.bucket_mb, scratch, extra=i == 0 and not args.no_extra)
    finally:
        ray.shutdown()

    for model, res in results.items():
        sync, peak, floor = res["sync"], res["peak"], res["floor"]
        print(f"\n{model} ({res['mib']:.0f} MiB fp32, {args.bucket_mb:g} MB buckets, 2 FSDP ranks -> 2 workers)")
        print(table(["transport", "sync s (median)", "peak extra MiB", "× object_store", "× memcpy floor"], [
            *[[name, sync[name], peak[name], sync[name] / sync["object_store"], sync[name] / floor] for name in sync],
            ["memcpy floor (1 copy, 1 thread)", floor, res["mib"], floor / sync["object_store"], 1.0],
            ["bare gloo broadcast (2 -> 2)", res["gloo"], 0.0, res["gloo"] / sync["object_store"], res["gloo"] / floor],
        ]))
    first = results[args.models.split(",")[0]]["sync"]
    print()
    if "lora adapter-only object_store" in first:  # the same transport both sides, then against the anchor
        print(f"lora adapter-only/full: {first['lora adapter-only object_store'] / first['object_store']:.2f}")
        print(f"lora adapter-only/full over broadcast: {first['lora adapter-only broadcast'] / first['broadcast']:.2f}")
        print(f"lora adapter-only/full over shared_memory: "
              f"{first['lora adapter-only shared_memory'] / first['shared_memory']:.2f}")
        print(f"lora adapter-only broadcast/full object_store: "
              f"{first['lora adapter-only broadcast'] / first['object_store']:.2f}")
    print(f"broadcast/bare gloo broadcast: {first['broadcast'] / results[args.models.split(',')[0]]['gloo']:.2f}")
    print(f"broadcast/object_store: {first['broadcast'] / first['object_store']:.2f}")
    print(f"shared_memory/object_store: {first['shared_memory'] / first['object_store']:.2f}")


if __name__ == "__main__":
    main()
