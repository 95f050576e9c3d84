"""The Tinker demo's last line (scripts/tinker_demo.sh): held-out success of the base model and of the
cookbook run's final checkpoint, through the official SDK, graded by tinker-cookbook's own arithmetic
environment. Runs in the cookbook's virtual environment (it imports nothing from toolrl).

The problems are 64 additions the run never trained on: drawn as the cookbook's ArithmeticDataset draws
them, from seeds past its batches, less any pair its first ``--train-batches`` batches hold. Each is
answered once, greedily (temperature 0), with the recipe's few-shot prompt, stop sequence and token cap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset
from tinker_cookbook.tokenizer_utils import get_tokenizer

HELD_OUT = 64


def problems(renderer: renderers.Renderer, groups_per_batch: int, train_batches: int) -> list:
    """The held-out environments' factories, each a ``partial(ArithmeticEnv, x, y, ...)``."""
    dataset = ArithmeticDataset(batch_size=groups_per_batch, renderer=renderer, group_size=1, n_batches=10**6)
    seen = {b.env_thunk.args for i in range(train_batches) for b in dataset.get_batch(i)}
    found, index = [], 10**5
    while len(found) < HELD_OUT:
        found += [b.env_thunk for b in dataset.get_batch(index) if b.env_thunk.args not in seen]
        index += 1
    return found[:HELD_OUT]


async def solved(client: tinker.SamplingClient, envs: list, max_tokens: int) -> int:
    async def one(make) -> float:
        env = make()
        prompt, stop = await env.initial_observation()
        params = tinker.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
        result = await client.sample_async(prompt=prompt, num_samples=1, sampling_params=params)
        return (await env.step(result.sequences[0].tokens)).metrics["correct"]

    return int(sum(await asyncio.gather(*(one(make) for make in envs))))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True, help="the base model's name, as the run trained it")
    parser.add_argument("--renderer", required=True)
    parser.add_argument("--log-path", required=True, help="the cookbook run's log_path (its checkpoints.jsonl)")
    parser.add_argument("--groups-per-batch", type=int, required=True)
    parser.add_argument("--train-batches", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=5)
    args = parser.parse_args()
    records = [json.loads(line) for line in (Path(args.log_path) / "checkpoints.jsonl").read_text().splitlines()]
    final = next(r for r in records if r["name"] == "final")
    renderer = renderers.get_renderer(args.renderer, tokenizer=get_tokenizer(args.model))
    envs = problems(renderer, args.groups_per_batch, args.train_batches)
    service = tinker.ServiceClient(base_url=args.base_url)
    before = await solved(service.create_sampling_client(base_model=args.model), envs, args.max_tokens)
    after = await solved(service.create_sampling_client(model_path=final["sampler_path"]), envs, args.max_tokens)
    print(f"held-out success: before {before}/{HELD_OUT} → after {after}/{HELD_OUT}")


if __name__ == "__main__":
    asyncio.run(main())
