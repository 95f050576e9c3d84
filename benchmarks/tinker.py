"""The Tinker API served by toolrl (``toolrl tinker serve``) against the same work called in process,
CPU, one thread each.

1. One training step, ``forward_backward`` (importance_sampling, ``--datums`` × ``--tokens`` tokens) then
   ``optim_step``, sent by the official ``tinker`` SDK to a ``toolrl tinker serve`` subprocess and waited
   for, against the same two steps of :mod:`toolrl_tinker.trainer` (the request's rows, then the step
   as the server takes it) on a LoRA adapter of the same rank on the same base in this process. Alternating rounds, medians, one warm-up of each excluded.
2. Sampling throughput (sampled tokens per second): one client's sampler sending ``--requests`` requests
   one at a time, against four clients and 32 (as many training runs, as many adapters) doing the same at
   once, which the engine batches across their adapters. Every request decodes exactly ``--max-tokens``
   tokens (``stop=[]``), seeded; one client, four and 32 alternate for ``--rounds`` rounds after a warm-up,
   medians. Beside them, the sampler's engine alone in this process (rounds alternated too): four and 32
   requests at once, each through its own adapter (as the clients' are), against one request through one
   of them. That is the bound this machine puts on the clients' gain: a CPU's decode step grows with its
   rows (32 rows' linears take about 2.5 times one row's here), each row reads its own adapter (32 clients'
   rank-8 adapters are 58% of SmolLM2's weights again), and the adapters' prompts are prefilled apart (one
   adapter's identical prompts would share one prefill).

    OMP_NUM_THREADS=1 python benchmarks/tinker.py [--base smollm2-135m-instruct] [--datums 8] [--tokens 256]
        [--rounds 3] [--requests 4] [--max-tokens 32] [--memory] [--memory-runs 8x2000@512,...] [--idle 5]

The base is SmolLM2-135M-Instruct, the model the demo serves: a decode step of a real model is its weights
read, which is what four clients' rows share. ``--base tiny-qwen3`` is a quick run on the tests' random
model, whose steps are per-row work over a 151,936-token vocabulary (no engine batches that away).

3. The same step (as 1.'s in-process anchor) on the trainer on two ranks (Ray actors on this machine, gloo,
   the base sharded with FSDP2, the adapter on both: toolrl's ``StepGroup``) against one in this process,
   alternating rounds, medians; and what the two ranks send per step, which bounds them on a CPU.

4. Memory: a fresh server's resident memory before one ``forward_backward``, at its peak, right after and
   ``--idle`` seconds after it, a server each (``--memory-runs``): 8 x 2,000 tokens at the default
   ``--micro-batch-tokens`` (512; a datum is never split, so each runs alone, as at any smaller size), then
   16 x 250 tokens at 512 (two datums a forward) and at 256 (one). ``--memory`` runs this part alone.

The last lines read ``served / in-process step time: X.XX`` (goal <= 1.15 at 8 x 256 tokens),
``4 clients / 1 client sampling throughput: Y.YY`` (goal >= 2.5), ``32 clients / 1 client sampling
throughput: Z.ZZ`` (goal >= 8) and ``2 ranks / 1 rank step time: W.WW``; then 4.'s table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from _common import free_port, machine, single_thread, table

# This file's name is the SDK's package's: `import tinker` must not find it.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
single_thread()

import numpy as np  # noqa: E402

KEY = "tml-benchmark-key"
# The clients (or adapters) the sampling rates compare: one against each of the others.
CLIENTS = (1, 4, 32)
# The memory part's requests (datums x tokens) and --micro-batch-tokens: 2,000-token datums run one to a
# forward at the default (512) and at any smaller size; 250-token datums two at 512, one at 256.
MEMORY_RUNS = "8x2000@512,16x250@512,16x250@256"


def datums(n: int, tokens: int, seed: int = 0) -> list[Any]:
    from tinker import types

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(10, 5000, tokens + 1)
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1].tolist()),
                               loss_fn_inputs={"target_tokens": ids[1:].astype(np.int64),
                                               "logprobs": rng.uniform(-12, -11, tokens).astype(np.float32),
                                               "advantages": rng.normal(0, 1, tokens).astype(np.float32)}))
    return out


def start_server(state_dir: str, base: str, *options: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "toolrl", "tinker", "serve", "--base", base, "--port", str(port),
                             "--state-dir", state_dir, "--max-batch-tokens", "1000000",
                             "--max-runs-per-client", str(max(CLIENTS)), *options], env=env,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for line in proc.stderr:
        if b"tinker API on" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, f"http://127.0.0.1:{port}"
    raise RuntimeError("the server did not start")


def in_process_step(trainer: Any, run: Any, req: Any) -> float:
    """The served step's work on ``trainer`` (a base's, in this process or on ranks): the request's rows,
    its forward_backward, then an optim_step with AdamParams' defaults (what ``served_step`` sends)."""
    from toolrl.training.optimizer import OptimizerSettings
    from toolrl_tinker.limits import Limits
    from toolrl_tinker.requests import token_rows

    limits = Limits()  # the server's defaults: the same micro-batches as the served step
    t = time.perf_counter()
    rows, loss = token_rows(req, trainer.vocab, limits.max_batch_tokens)
    trainer.step(run, rows, loss, False, limits.micro_batch_tokens)
    trainer.optim_step(run, OptimizerSettings(lr=1e-4, betas=(0.9, 0.95), eps=1e-12))
    return time.perf_counter() - t


def ranks_step(local: Any, run: Any, req: Any, rounds: int) -> tuple[list[float], list[float], str]:
    """The same step on the in-process trainer and on one of two ranks (a local Ray, gloo), alternating
    rounds after a warm-up of each; and what the two ranks send per step, which bounds them."""
    from toolrl.config import RayConfig
    from toolrl.processes.step_group import shares
    from toolrl.training.token_step import micro_batch_spans
    from toolrl_tinker.limits import Limits
    from toolrl_tinker.trainer import Ranks, Trainer

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    two = Trainer(local.path, Ranks(2, RayConfig(address="local")))
    try:
        two.create(run)
        one_t, two_t = [], []
        for r in range(rounds + 1):
            one, both = in_process_step(local.trainer, run, req), in_process_step(two, run, req)
            if r:
                one_t.append(one)
                two_t.append(both)
    finally:
        two.close()
    lengths = [len(d.tokens) for d in req.data]
    cuts = shares(lengths, 2)
    forwards = max(len(micro_batch_spans(lengths[a:b], Limits().micro_batch_tokens)) for a, b in zip(cuts, cuts[1:]))
    model = local.trainer.ranks.model
    base_mb = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not p.requires_grad
                  and ".lora_" not in n) / 2**20
    adapter_mb = sum(t.numel() * t.element_size() for t in local.trainer.adapter_state(run).values()) / 2**20
    bound = (f"each rank all-gathers the other's half of the base ({base_mb:.0f} MB in all) layer by layer in every "
             f"forward and again in its backward: {forwards} forwards a step, {forwards * base_mb:.0f} MB received per "
             f"rank; the adapter's gradient all-reduced once ({adapter_mb:.1f} MB); the two ranks share this "
             f"machine's {os.cpu_count()} cores")
    return one_t, two_t, bound


def proc_memory(pid: int) -> dict[str, int]:
    """Process ``pid``'s resident memory now (``VmRSS``) and its peak since the last reset (``VmHWM``), in
    bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(fields[k].split()[0]) << 10 for k in ("VmRSS", "VmHWM")}


def memory_row(base: str, n: int, tokens: int, micro: int, idle: float) -> list[str]:
    """A fresh server's resident memory (GiB) before one forward_backward of ``n`` x ``tokens`` tokens, at its
    peak, right after and ``idle`` seconds later, with ``--micro-batch-tokens micro`` (a server of its own:
    the peak is the process's, reset just before the request)."""
    import tinker
    from toolrl.training.token_step import micro_batch_spans

    with tempfile.TemporaryDirectory() as state:
        proc, url = start_server(state, base, "--micro-batch-tokens", str(micro))
        try:
            tc = tinker.ServiceClient(base_url=url, api_key=KEY).create_lora_training_client(
                base_model=base, rank=8, seed=0).result()
            time.sleep(1.0)  # the client's creation done with
            before = proc_memory(proc.pid)["VmRSS"]
            with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
                f.write("5")  # the peak (VmHWM) back to the resident memory now: the request's alone
            tc.forward_backward(datums(n, tokens), "importance_sampling").result()
            done = proc_memory(proc.pid)
            time.sleep(idle)
            after = proc_memory(proc.pid)["VmRSS"]
        finally:
            proc.terminate()
            proc.wait(30)
    forward = max(b - a for a, b in micro_batch_spans([tokens] * n, micro)) * tokens
    return [f"{n} x {tokens}", str(micro), str(forward),
            *(f"{v / 2**30:.2f}" for v in (before, done["VmHWM"], done["VmRSS"], after))]


def memory(args: argparse.Namespace) -> str:
    """The memory part's table (``--memory-runs``: each ``DATUMSxTOKENS@MICRO``), as printed."""
    rows = []
    for spec in args.memory_runs.split(","):
        shape, micro = spec.split("@")
        n, tokens = shape.split("x")
        rows.append(memory_row(args.base, int(n), int(tokens), int(micro), args.idle))
    return (f"resident memory (GiB) of a fresh server around one forward_backward, {args.base} (a datum is never "
            "split: a longer one runs alone)\n" + table(
                ["request", "--micro-batch-tokens", "tokens per forward", "before", "peak", "right after",
                 f"{args.idle:g} s idle"], rows))


def served_step(tc: Any, data: list[Any]) -> float:
    from tinker import types

    t = time.perf_counter()
    fb = tc.forward_backward(data, "importance_sampling")
    step = tc.optim_step(types.AdamParams(learning_rate=1e-4))
    fb.result()
    step.result()
    return time.perf_counter() - t


def as_request(data: list[Any]) -> Any:
    """The SDK's datums as the wire hands an importance_sampling forward_backward to the service."""
    from toolrl_tinker.requests import Datum, ForwardBackward

    datums = [Datum(np.asarray(d.model_input.to_ints(), np.int64), {k: v.to_numpy() for k, v in d.loss_fn_inputs.items()})
              for d in data]
    return ForwardBackward("bench", None, "importance_sampling", None, False, datums)


def sampling(samplers: list[Any], requests: int, max_tokens: int) -> float:
    """Sampled tokens per second of every sampler sending ``requests`` requests, one at a time each."""
    from tinker import types

    prompt = types.ModelInput.from_ints(list(range(100, 132)))
    params = types.SamplingParams(max_tokens=max_tokens, stop=[], seed=1, temperature=1.0)
    counts = [0] * len(samplers)

    def client(i: int) -> None:
        for _ in range(requests):
            res = samplers[i].sample(prompt, 1, params).result()
            counts[i] += sum(len(s.tokens) for s in res.sequences)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(samplers))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(counts) / (time.perf_counter() - t)


def engine_rows(engine: Any, adapters: list[str], requests: int, max_tokens: int) -> float:
    """Sampled tokens per second of the sampler's engine alone, in this process (no server): one request
    per adapter in ``adapters`` at once, ``requests`` times. k adapters' rate over one's bounds what k
    clients can gain."""
    import asyncio

    from toolrl.engines import SamplingParams

    params = SamplingParams(max_new_tokens=max_tokens, seed=1, stop_token_ids=[])

    async def go() -> int:
        done = 0
        for _ in range(requests):
            gens = await asyncio.gather(*(engine.generate(list(range(100, 132)), params, adapter=a)
                                          for a in adapters))
            done += sum(len(g[0].token_ids) for g in gens)
        return done

    t = time.perf_counter()
    return asyncio.run(go()) / (time.perf_counter() - t)


def local_samplers(local: Any, runs: list[Any]) -> list[str]:
    """The runs' adapters copied to ``local``'s sampler, as saving weights for a sampler does on the server."""
    names = []
    for i, run in enumerate(runs):
        local.trainer.create(run)
        local.sampler.put(run.model_id, f"sampler_{i}", run.rank, run.targets, local.trainer.adapter_state(run))
        names.append(f"sampler_{i}")
    return names


def alternated(rate: Callable[[int, int], float], requests: int, rounds: int) -> dict[int, list[float]]:
    """``rate(k, requests)`` for each of CLIENTS' k samplers (or adapters) in alternating rounds, each rate's
    runs; a first round of one request each is a warm-up, not kept (one measurement of each swung ±5% with
    the machine)."""
    runs: dict[int, list[float]] = {k: [] for k in CLIENTS}
    for r in range(rounds + 1):
        for k, kept in runs.items():
            value = rate(k, requests if r else 1)
            if r:
                kept.append(value)
    return runs


def _each(values: list[float], digits: int = 1) -> str:
    return " ".join(f"{x:.{digits}f}" for x in values)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datums", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--base", default="smollm2-135m-instruct", help="the base model (smollm2-135m-instruct, tiny-qwen3)")
    p.add_argument("--memory", action="store_true", help="run only the memory part (4.)")
    p.add_argument("--memory-runs", default=MEMORY_RUNS, help="the memory part's requests and micro-batch sizes: "
                   "DATUMSxTOKENS@MICRO, comma-separated")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle after the memory part's request")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    os.environ["TINKER_API_KEY"] = KEY
    if args.memory:
        print(machine())
        print(memory(args))
        return
    import tinker
    from toolrl_tinker.adapters import ATTN, MLP
    from toolrl_tinker.bases import Base
    from toolrl_tinker.trainer import Run

    data = datums(args.datums, args.tokens)
    local = Base.load(args.base)
    runs = [Run(f"bench:train:{i}", "me", local.name, args.rank, ATTN + MLP, i) for i in range(max(CLIENTS))]
    adapters = local_samplers(local, runs)
    run = runs[0]
    with tempfile.TemporaryDirectory() as state:
        proc, url = start_server(state, args.base)
        try:
            service = tinker.ServiceClient(base_url=url, api_key=KEY)
            tc = service.create_lora_training_client(base_model=args.base, rank=args.rank, seed=0).result()
            req = as_request(data)
            served, local_t = [], []
            for r in range(args.rounds + 1):
                s, loc = served_step(tc, data), in_process_step(local.trainer, run, req)
                if r:
                    served.append(s)
                    local_t.append(loc)
            clients = [tc] + [service.create_lora_training_client(base_model=args.base, rank=args.rank, seed=i).result()
                              for i in range(1, max(CLIENTS))]
            samplers = [c.save_weights_and_get_sampling_client().result() for c in clients]
            rates = alternated(lambda k, n: sampling(samplers[:k], n, args.max_tokens), args.requests, args.rounds)
        finally:
            proc.terminate()
            proc.wait(30)
    alones = alternated(lambda k, n: engine_rows(local.sampler.engine, adapters[:k], n, args.max_tokens), args.requests,
                        args.rounds)
    one_rank, two_ranks, bound = ranks_step(local, run, as_request(data), args.rounds)
    rate, alone = ({k: statistics.median(runs[k]) for k in CLIENTS} for runs in (rates, alones))
    s_med, l_med = statistics.median(served), statistics.median(local_t)
    print(machine())
    print(f"{args.datums} x {args.tokens} tokens, rank {args.rank}, {args.base}, {args.rounds} rounds")
    print(table(["step", "median s", "runs"], [["served (SDK -> toolrl tinker serve)", f"{s_med:.3f}", _each(served, 3)],
                                                 ["in process (toolrl_tinker.trainer)", f"{l_med:.3f}", _each(local_t, 3)]]))
    print(table(["sampling", "median tokens/s", "runs"], [
        *([f"{k} client{'s' * (k > 1)}", f"{rate[k]:.1f}", _each(rates[k])] for k in CLIENTS),
        *([f"the engine alone, {k} adapter{'s at once' * (k > 1)}", f"{alone[k]:.1f}", _each(alones[k])]
          for k in CLIENTS)]))
    for k in CLIENTS[1:]:
        print(f"the engine alone, {k} adapters at once / 1: {alone[k] / alone[1]:.2f} (the most {k} clients can gain here)")
    print(table(["step on ranks", "median s", "runs"], [
        ["1 rank (in process)", f"{statistics.median(one_rank):.3f}", _each(one_rank, 3)],
        ["2 ranks (Ray, gloo, FSDP2)", f"{statistics.median(two_ranks):.3f}", _each(two_ranks, 3)]]))
    print(f"what bounds 2 ranks: {bound}")
    print(f"served / in-process step time: {s_med / l_med:.2f}")
    for k in CLIENTS[1:]:
        print(f"{k} clients / 1 client sampling throughput: {rate[k] / rate[1]:.2f}")
    print(f"2 ranks / 1 rank step time: {statistics.median(two_ranks) / statistics.median(one_rank):.2f}")
    print(memory(args))


if __name__ == "__main__":
    main()
