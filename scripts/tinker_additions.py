"""The Tinker demo's data and grades (scripts/tinker_demo.sh), on tinker-cookbook's own arithmetic environment.
Runs in the cookbook's virtual environment (it imports nothing from toolrl).

``sl-data OUT``: a chat JSONL of additions with their answers, for the cookbook's ``chat_sl`` recipe (a local
file, as ``dataset=*.jsonl`` reads it): each conversation is the arithmetic recipe's own few-shot prompt, a
question and its sum, drawn as the recipe's ``ArithmeticDataset`` draws problems, from seeds of their own.

``held-out``: 64 problems (``--problems``) no stage trained on (drawn the same way from seeds past both, less
any pair the SL file or the RL run's batches hold), asked with the recipe's prompt, stop sequence and token cap
through the official SDK, and graded by the recipe's ``ArithmeticEnv``. The base model, the SL run's final
checkpoint (the RL run's start), every sampler checkpoint the RL run saved and its final one each answer each
problem greedily once and at the recipe's sampling temperature (1.0) eight times (``--draws``; mean problems
solved per draw). The RL run's curve is printed, and the last line compares its start with its end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv
from tinker_cookbook.tokenizer_utils import get_tokenizer

SL_SEEDS = 50_000  # the SL file's first batch seed; the RL run's batches are seeded 0, 1, ...
HELD_OUT_SEEDS = 100_000


def sl_pairs(examples: int) -> list[tuple[int, int]]:
    """The SL file's problems: ``examples`` pairs from the recipe's draw, seeds SL_SEEDS, SL_SEEDS + 1, ..."""
    dataset = ArithmeticDataset(batch_size=64, renderer=None, group_size=1, n_batches=10**6)
    pairs: list[tuple[int, int]] = []
    index = SL_SEEDS
    while len(pairs) < examples:
        pairs += [b.env_thunk.args for b in dataset.get_batch(index)]
        index += 1
    return pairs[:examples]


def write_sl_data(out: Path, examples: int) -> None:
    prefix = ArithmeticEnv.standard_fewshot_prefix()
    with open(out, "w") as f:
        for x, y in sl_pairs(examples):
            env = ArithmeticEnv(x, y, renderer=None)
            messages = [*prefix, {"role": "user", "content": env.get_question()},
                        {"role": "assistant", "content": env.get_reference_answer()}]
            f.write(json.dumps({"messages": messages}) + "\n")


def held_out_problems(renderer: renderers.Renderer, groups_per_batch: int, train_batches: int,
                      sl_examples: int, count: int) -> list:
    """``count`` held-out environments' factories, each a ``partial(ArithmeticEnv, x, y, ...)``."""
    dataset = ArithmeticDataset(batch_size=groups_per_batch, renderer=renderer, group_size=1, n_batches=10**6)
    seen = {b.env_thunk.args for i in range(train_batches) for b in dataset.get_batch(i)} | set(sl_pairs(sl_examples))
    found, index = [], HELD_OUT_SEEDS
    while len(found) < count:
        found += [b.env_thunk for b in dataset.get_batch(index) if b.env_thunk.args not in seen]
        index += 1
    return found[:count]


async def solved(client: tinker.SamplingClient, envs: list, max_tokens: int, temperature: float, draws: int) -> float:
    """Problems solved per draw: the mean over ``draws`` samples of each problem, summed over problems."""
    async def one(make) -> float:
        prompt, stop = await make().initial_observation()
        params = tinker.SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop)
        result = await client.sample_async(prompt=prompt, num_samples=draws, sampling_params=params)
        return sum([(await make().step(s.tokens)).metrics["correct"] for s in result.sequences]) / draws

    return sum(await asyncio.gather(*(one(make) for make in envs)))


def checkpoints(log_path: str) -> list[dict]:
    return [json.loads(line) for line in (Path(log_path) / "checkpoints.jsonl").read_text().splitlines()]


def final_sampler(log_path: str) -> str:
    return next(r for r in checkpoints(log_path) if r["name"] == "final")["sampler_path"]


def rl_samplers(log_path: str) -> dict[int, str]:
    """The RL run's sampler weights by steps trained: those it saved every ``save_every`` steps, then its final ones."""
    return {int(r["batch"]): r["sampler_path"] for r in checkpoints(log_path)}


async def held_out(args: argparse.Namespace) -> None:
    renderer = renderers.get_renderer(args.renderer, tokenizer=get_tokenizer(args.model))
    envs = held_out_problems(renderer, args.groups_per_batch, args.train_batches, args.sl_examples, args.problems)
    service = tinker.ServiceClient(base_url=args.base_url)
    rl = {0: final_sampler(args.sl_log), **rl_samplers(args.rl_log)}  # step 0: the SL checkpoint it loaded
    clients = {"base model": service.create_sampling_client(base_model=args.model),
               **{step: service.create_sampling_client(model_path=path) for step, path in rl.items()}}
    greedy = {name: await solved(c, envs, args.max_tokens, 0.0, 1) for name, c in clients.items()}
    sampled = {name: await solved(c, envs, args.max_tokens, 1.0, args.draws) for name, c in clients.items()}
    start, end, n = 0, max(rl), args.problems
    named = {"base model": "base model", start: "after SL", end: "after RL"}
    print("held-out success, greedy: " + ", ".join(f"{name} {greedy[k]:.0f}/{n}" for k, name in named.items()))
    print(f"held-out success, temperature 1 ({args.draws} draws a problem, mean): "
          + ", ".join(f"{name} {sampled[k]:.1f}/{n}" for k, name in named.items()))
    print(f"held-out success over the RL run's steps, greedy (temperature 1), of {n}: "
          + ", ".join(f"step {k} {greedy[k]:.0f} ({sampled[k]:.1f})" for k in rl))
    print(f"held-out success, the RL run's start → end: greedy {greedy[start]:.0f}/{n} → {greedy[end]:.0f}/{n}, "
          f"temperature 1 {sampled[start]:.1f}/{n} → {sampled[end]:.1f}/{n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("sl-data", help="write the SL recipe's chat JSONL")
    data.add_argument("out", type=Path)
    data.add_argument("--examples", type=int, required=True)
    grade = sub.add_parser("held-out", help="grade the base model, the SL run's and the RL run's final checkpoints")
    grade.add_argument("--base-url", required=True)
    grade.add_argument("--model", required=True, help="the base model's name, as the runs trained it")
    grade.add_argument("--renderer", required=True)
    grade.add_argument("--sl-log", required=True, help="the chat_sl run's log_path (its checkpoints.jsonl)")
    grade.add_argument("--rl-log", required=True, help="the math_rl run's log_path")
    grade.add_argument("--sl-examples", type=int, required=True)
    grade.add_argument("--groups-per-batch", type=int, required=True)
    grade.add_argument("--train-batches", type=int, required=True)
    grade.add_argument("--max-tokens", type=int, default=5)
    grade.add_argument("--problems", type=int, default=64, help="held-out problems")
    grade.add_argument("--draws", type=int, default=8, help="samples of each problem at temperature 1")
    args = parser.parse_args()
    if args.command == "sl-data":
        write_sl_data(args.out, args.examples)
    else:
        asyncio.run(held_out(args))


if __name__ == "__main__":
    main()
