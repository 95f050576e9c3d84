"""Routing replay (R3) on a tiny random mixture-of-experts model, engine in bfloat16 and trainer in
float32, side by side in one run: how far the trainer's log-probs of the engine's samples are from the
engine's own with and without replaying the engine's recorded experts, and what recording them costs
the engine.

The transformers engine (``record_routes`` on) samples ``--groups`` groups of ``--n`` from prompts of
``--prompt`` random tokens, ``--new`` tokens each at temperature 1; the trainer (float32, the same
weights) computes the sampled tokens' log-probs over the packed, prefix-shared batch with its own
routing and with the engine's replayed. Per trained token: the share whose experts differ from the
engine's in at least one layer (read from the experts modules' inputs), the mean |trainer - engine|
log-prob and the k3 estimate of KL(engine ‖ trainer). Engine overhead: the same generations with
and without recording, alternating, ``--repeats`` times each (median; the fastest runs' ratio too, the
least disturbed by other load on the machine).

Last lines: ``lp mismatch with/without R3: X.XX`` (the ratio of the mean |trainer - engine| log-probs)
and ``route recording overhead: X.XX`` (the fraction of the engine's time recording adds).

    OMP_NUM_THREADS=1 python benchmarks/routing_replay.py [--quick] [--layers 8] [--experts 32] [--top-k 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from _common import machine, median, single_thread, table

single_thread()


def generate(engine: Any, prompts: list[list[int]], n: int, new: int) -> list[list[Any]]:
    from toolrl.engines import SamplingParams

    async def run() -> list[list[Any]]:
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_new_tokens=new, seed=g), n)
                                      for g, p in enumerate(prompts)])
    return asyncio.run(run())


def trainer_view(model: Any, batch: Any, replay: bool) -> tuple[Any, Any]:
    """The trainer's log-probs of the batch's trained tokens (B, R) and the experts its forward used."""
    import torch
    from toolrl.engines.routing import Routing
    from toolrl.training.step import response_logprobs

    used: list[Any] = []
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    hooks = [m.register_forward_pre_hook(lambda mod, args: used.append(args[1].clone())) for m in experts]
    routing = Routing(model)
    routing.replay(batch.routes if replay else None)
    with torch.no_grad():
        lp = response_logprobs(model, batch)
    routing.remove()
    for h in hooks:
        h.remove()
    return lp, torch.stack(used, dim=1)


def compare(model: Any, batch: Any, replay: bool) -> dict[str, float]:
    lp, used = trainer_view(model, batch, replay)
    mask = batch.response_mask.bool()
    delta = (lp - batch.engine_logprobs)[mask]  # log(π_trainer / π_engine)
    # The experts behind each trained token: those of the position that predicts it.
    differ = (used.sort(-1).values != batch.routes.sort(-1).values).any(-1).any(-1)[batch.head_pos]
    return {"routes_differ": float(differ.float().mean()), "lp_mismatch": float(delta.abs().mean()),
            "k3_kl": float((delta.exp() - 1 - delta).mean())}


def figures(row: dict[str, float]) -> list[str]:
    return [f"{row['routes_differ']:.3f}", f"{row['lp_mismatch']:.2e}", f"{row['k3_kl']:.2e}"]


def engine_time(model: Any, tokenizer: Any, record: bool, prompts: list[list[int]], n: int, new: int) -> float:
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig

    engine = TransformersEngine(model, tokenizer, TransformersEngineConfig(record_routes=record, seed=0))
    t0 = time.perf_counter()
    generate(engine, prompts, n, new)
    elapsed = time.perf_counter() - t0
    if engine._routing is not None:
        engine._routing.remove()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smaller model and batch (about a minute)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.layers, args.experts, args.groups, args.new, args.repeats = 8, 16, 2, 24, 3

    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from toolrl.model_sources import load_model, load_tokenizer, tiny_moe
    from toolrl.training.packing import build_batch
    from toolrl.trajectory import Trajectory

    path = tiny_moe(num_hidden_layers=args.layers, num_experts=args.experts, num_experts_per_tok=args.top_k)
    engine_model, tokenizer = load_model(path, dtype="bfloat16"), load_tokenizer(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 150_000) for _ in range(args.prompt)] for _ in range(args.groups)]
    engine = TransformersEngine(engine_model, tokenizer, TransformersEngineConfig(record_routes=True, seed=0))
    trajs = [Trajectory(trajectory_id=f"{g}-{k}", sample_index=k, group=g, prompt_ids=prompts[g],
                        response_ids=gen.token_ids, response_mask=[1] * len(gen.token_ids), logprobs=gen.logprobs,
                        routes=gen.routes)
             for g, gens in enumerate(generate(engine, prompts, args.n, args.new)) for k, gen in enumerate(gens)]
    engine._routing.remove()
    batch = build_batch(trajs, [0.0] * len(trajs), share_prefixes=True)
    trainer = load_model(path)
    without, with_r3 = compare(trainer, batch, replay=False), compare(trainer, batch, replay=True)

    off: list[float] = []
    on: list[float] = []
    for _ in range(args.repeats):  # alternating, so load drifts hit both alike
        off.append(engine_time(engine_model, tokenizer, False, prompts, args.n, args.new))
        on.append(engine_time(engine_model, tokenizer, True, prompts, args.n, args.new))
    overhead = median(on) / median(off) - 1

    print(machine())
    print(f"tiny-moe: {args.layers} layers, {args.experts} experts, top-{args.top_k}; {len(trajs)} samples of "
          f"{args.new} tokens after {args.prompt}-token prompts; engine bfloat16, trainer float32")
    print(table(["trainer routing", "tokens with a routing difference", "mean |lp trainer - engine|",
                 "k3 KL(engine || trainer)"],
                [["own (no replay)", *figures(without)], ["engine's (R3)", *figures(with_r3)]]))
    print(table(["engine", "median s", "min s", "runs"], [["without recording", median(off), min(off), len(off)],
                                                          ["recording routes", median(on), min(on), len(on)]]))
    print(f"k3 KL with/without R3: {with_r3['k3_kl'] / without['k3_kl']:.2f}")
    print(f"lp mismatch with/without R3: {with_r3['lp_mismatch'] / without['lp_mismatch']:.2f}")
    print(f"route recording overhead (fastest runs): {min(on) / min(off) - 1:.2f}")
    print(f"route recording overhead: {overhead:.2f}")


if __name__ == "__main__":
    main()
