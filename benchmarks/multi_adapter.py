"""Several adapters in one batch: the transformers engine's decode step serving k LoRA adapters (one per
role, ``model.adapters``) against the same batch under one adapter, k = 1, 2, 4, 8, CPU, one thread.

The engine holds 8 adapters (rank ``--rank``, every Linear, random A and B so no delta is zero). Each
round sends ``--rows`` concurrent ``generate`` calls (distinct chat prompts, seeded sampling at
temperature 1, no stop, so every row decodes exactly ``--tokens`` tokens), row i under adapter i mod k;
the four k alternate within the round. The decode step is timed where it runs: forward hooks on the
model time each of its forwards, and a forward of one new token per row is a decode step (a prefill
feeds the prompts). Each step is timed twice: its wall time, and the CPU time of the engine's worker
thread that runs it (one OpenMP thread: the step's own compute, which other processes on a shared
machine slow down far less than its wall time). The figures per k are medians over all rounds' steps;
one warm-up batch per k is excluded. Prefill and whole-batch wall times are printed beside them; the
last line is the ratio of CPU times.

    OMP_NUM_THREADS=1 python benchmarks/multi_adapter.py [--model smollm2-135m-instruct] [--rows 16]
        [--tokens 32] [--rounds 3] [--rank 8]

The last line reads ``k=8 / k=1 decode time: X.XX`` (goal <= 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _common import machine, single_thread, table

single_thread()

import torch  # noqa: E402
from toolrl import model_sources  # noqa: E402
from toolrl.config import AdapterConfig  # noqa: E402
from toolrl.engines import ModelSource, SamplingParams  # noqa: E402
from toolrl.engines.transformers import TransformersEngine  # noqa: E402
from toolrl.modeling.adapters import apply_adapters  # noqa: E402

single_thread()

MODELS = {"tiny-qwen3": model_sources.tiny_qwen3, "smollm2-135m-instruct": model_sources.smollm2_135m}
ROLES = [f"role{i}" for i in range(8)]
KS = (1, 2, 4, 8)


class ForwardTimer:
    """Wall and thread CPU time of each model forward, filed as a decode step (one new token per row)
    or a prefill (wall time only)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.decode: list[float] = []
        self.decode_cpu: list[float] = []
        self.prefill: list[float] = []
        self._start = self._start_cpu = 0.0
        self._q = 0
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after)

    def _before(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self._q = kwargs["input_ids"].shape[1]
        self._start, self._start_cpu = time.perf_counter(), time.thread_time()

    def _after(self, module: Any, args: Any, output: Any) -> None:
        wall, cpu = time.perf_counter() - self._start, time.thread_time() - self._start_cpu
        if self._q == 1:
            self.decode.append(wall)
            self.decode_cpu.append(cpu)
        else:
            self.prefill.append(wall)

    def reset(self) -> None:
        self.decode, self.decode_cpu, self.prefill = [], [], []


def build(path: str, rank: int, rows: int) -> TransformersEngine:
    engine = TransformersEngine.create(ModelSource(path, tokenizer=model_sources.load_tokenizer(path)),
                                       {"device": "cpu", "dtype": "float32", "max_batch_size": rows})
    engine.apply_adapters(lambda m: apply_adapters(m, {r: AdapterConfig(r=rank, alpha=2 * rank) for r in ROLES}))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return engine


def prompts(tokenizer: Any, rows: int) -> list[list[int]]:
    questions = [f"What is {11 + 5 * i} * {7 + 6 * i}? Answer with the number only." for i in range(rows)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          return_dict=False) for q in questions]


async def batch(engine: TransformersEngine, batch_prompts: list[list[int]], k: int, tokens: int,
                seed: int) -> float:
    """Seconds for one concurrent batch, row i under adapter i mod k."""
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(
        engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=seed + i), adapter=ROLES[i % k])
        for i, p in enumerate(batch_prompts)))
    seconds = time.perf_counter() - t0
    if any(len(g[0].token_ids) != tokens for g in gens):
        raise RuntimeError("a row stopped early: every row must decode --tokens tokens")
    return seconds


async def measure(engine: TransformersEngine, timer: ForwardTimer, batch_prompts: list[list[int]], tokens: int,
                  rounds: int) -> dict[int, dict[str, list[float]]]:
    out: dict[int, dict[str, list[float]]] = {k: {"decode": [], "decode_cpu": [], "prefill": [], "batch": []}
                                              for k in KS}
    for k in KS:
        await batch(engine, batch_prompts, k, 4, 99_999)  # warm-up
    for r in range(rounds):
        for k in KS:
            timer.reset()
            seconds = await batch(engine, batch_prompts, k, tokens, 1_000 * r)
            out[k]["decode"] += timer.decode
            out[k]["decode_cpu"] += timer.decode_cpu
            out[k]["prefill"] += timer.prefill
            out[k]["batch"].append(seconds)
            print(f"round {r + 1} k={k}: decode step {1e3 * statistics.median(timer.decode):7.2f} ms wall, "
                  f"{1e3 * statistics.median(timer.decode_cpu):7.2f} ms CPU (medians of {len(timer.decode)}), "
                  f"batch {seconds:6.2f} s", flush=True)
    await engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m-instruct",
                        help="smollm2-135m-instruct: a real small model; tiny-qwen3: the tests' random model")
    parser.add_argument("--rows", type=int, default=16, help="rows (samples) decoded together")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8, help="every adapter's rank")
    args = parser.parse_args()

    path = MODELS[args.model]()
    engine = build(path, args.rank, args.rows)
    timer = ForwardTimer(engine.model)
    batch_prompts = prompts(engine.tokenizer, args.rows)
    results = asyncio.run(measure(engine, timer, batch_prompts, args.tokens, args.rounds))

    print()
    print(machine())
    print(f"model {args.model}; 8 adapters of rank {args.rank} on every Linear; {args.rows} rows x {args.tokens} "
          f"tokens, row i under adapter i mod k; {args.rounds} rounds")
    wall, cpu = (statistics.median(results[1][key]) for key in ("decode", "decode_cpu"))
    rows = [[k, 1e3 * statistics.median(r["decode_cpu"]), statistics.median(r["decode_cpu"]) / cpu,
             1e3 * statistics.median(r["decode"]), statistics.median(r["decode"]) / wall,
             1e3 * statistics.median(r["prefill"]), statistics.median(r["batch"])] for k, r in results.items()]
    print(table(["k adapters", "decode CPU ms", "/ k=1", "decode wall ms", "/ k=1", "prefill wall ms", "batch s"],
                rows))
    print(f"\nk=8 / k=1 decode time: {statistics.median(results[8]['decode_cpu']) / cpu:.2f}")


if __name__ == "__main__":
    main()
