"""Routing replay (R3) on a tiny random mixture-of-experts model, engine in bfloat16 and trainer in
float32, side by side in one run: how far the trainer's log-probs of the engine's samples are from the
engine's own with and without replaying the engine's recorded experts, where that gap comes from, and
what recording the experts costs the engine.

The transformers engine (``record_routes`` on) samples ``--groups`` groups of ``--n`` from prompts of
``--prompt`` random tokens, ``--new`` tokens each at temperature 1; the trainer (float32, the same
weights) computes the sampled tokens' log-probs over the packed, prefix-shared batch with its own
routing and with the engine's replayed. Per trained token: the share whose experts differ from the
engine's in at least one layer (read from the experts modules' inputs), the mean |trainer - engine|
log-prob and the k3 estimate of KL(engine ‖ trainer).

Where the gap comes from, measured rather than assumed:

- a float32 engine as control: the trainer's routing then agrees with the engine's, so R3 must leave
  the gap (the implementations' own difference) as it is; a replay that forced other experts than the
  engine used (a token shifted by one, say) would widen it;
- the bfloat16 gap split between the tokens whose experts differ from the engine's and the rest: R3
  should bring the former down to the latter's level, which is bfloat16's dense numerics (every matmul
  and the logits rounded), the part replay cannot remove.

``--expert-scale`` (default 2) multiplies every expert's weights, in the engine and the trainer alike:
at the random initialisation each expert's output passes three matrices of std 0.02 and comes out 10×
smaller than the attention's, so which experts a token meets hardly matters, unlike in a trained MoE,
whose experts carry as much of the residual stream as its attention. The run prints the ratio of the
two outputs it got; ``--expert-scale 1`` is the untouched random model.

Engine overhead: the same generations with and without recording in ``--repeats`` rounds of off,
on, on, off after a warm-up; each round's ratio (of each half's faster run), so a load swing on the
machine hits both halves of a round alike. Median of the rounds' ratios, of the process's CPU time
(what the engine computes: time the machine's other load takes from it is left out; the engine runs
on one thread) and of wall time.

Last lines: ``lp mismatch with/without R3: X.XX`` (the ratio of the mean |trainer - engine| log-probs)
and ``route recording overhead: X.XX`` (the fraction of the engine's CPU time recording adds).

    OMP_NUM_THREADS=1 python benchmarks/routing_replay.py [--quick] [--layers 8] [--experts 32] [--top-k 2]
"""

from __future__ import annotations

import argparse
import asyncio
import math
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


def load(path: str, dtype: str, expert_scale: float, device: str = "cpu") -> Any:
    """The model at ``path`` in ``dtype`` on ``device``, every expert's weights times ``expert_scale``."""
    import torch
    from toolrl.model_sources import load_model

    model = load_model(path, dtype=dtype, device=device)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("Experts"):
                for p in module.parameters():
                    p.mul_(expert_scale)
    return model


def sample(engine_model: Any, tokenizer: Any, prompts: list[list[int]], n: int, new: int, device: str = "cpu") -> Any:
    """The engine's samples, experts recorded, packed with shared prefixes as the trainer packs them."""
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from toolrl.training.packing import build_batch
    from toolrl.trajectory import Trajectory

    engine = TransformersEngine(engine_model, tokenizer, TransformersEngineConfig(record_routes=True, seed=0, device=device))
    trajs = [Trajectory(trajectory_id=f"{g}-{k}", sample_index=k, group=g, prompt_ids=prompts[g],
                        response_ids=gen.token_ids, response_mask=[1] * len(gen.token_ids), logprobs=gen.logprobs,
                        routed_experts=gen.routed_experts)
             for g, gens in enumerate(generate(engine, prompts, n, new)) for k, gen in enumerate(gens)]
    engine._routing.remove()
    return build_batch(trajs, [0.0] * len(trajs), device, share_prefixes=True)


def trainer_view(model: Any, batch: Any, replay: bool) -> tuple[Any, Any, float]:
    """The trainer's log-probs of the batch's trained tokens (B, R), the experts its forward used and
    the ratio of its sparse blocks' output std to its attention's."""
    import torch
    from toolrl.modeling.expert_routing import ExpertRouting
    from toolrl.training.step import response_logprobs

    used: list[Any] = []
    stds: dict[str, list[float]] = {"moe": [], "attention": []}

    def output_std(kind: str) -> Any:
        return lambda mod, args, out: stds[kind].append(float((out[0] if isinstance(out, tuple) else out).std()))

    hooks = [m.register_forward_pre_hook(lambda mod, args: used.append(args[1].clone()))
             for m in model.modules() if type(m).__name__.endswith("Experts")]
    hooks += [m.register_forward_hook(output_std("moe" if type(m).__name__.endswith("SparseMoeBlock") else "attention"))
              for m in model.modules() if type(m).__name__.endswith(("SparseMoeBlock", "Attention"))]
    routing = ExpertRouting(model)
    routing.replay(batch.routed_experts if replay else None)
    with torch.no_grad():
        lp = response_logprobs(model, batch)
    routing.remove()
    for h in hooks:
        h.remove()
    return lp, torch.stack(used, dim=1), median(stds["moe"]) / median(stds["attention"])


def compare(model: Any, batch: Any, replay: bool) -> dict[str, float]:
    lp, used, expert_share = trainer_view(model, batch, replay)
    mask = batch.response_mask.bool()
    gap = (lp - batch.engine_logprobs)[mask]  # log(π_trainer / π_engine)
    # The experts behind each trained token: those of the position that predicts it.
    differ = (used.sort(-1).values != batch.routed_experts.sort(-1).values).any(-1).any(-1)[batch.head_pos]
    return {"routes_differ": float(differ.float().mean()), "lp_mismatch": float(gap.abs().mean()),
            "k3_kl": float((gap.exp() - 1 - gap).mean()), "expert_share": expert_share,
            "gap": gap, "differ": differ}


def split(row: dict[str, Any], differ: Any) -> tuple[float, float]:
    """Mean |lp gap| over the tokens flagged in ``differ`` and over the others (nan where none)."""
    gap = row["gap"].abs()
    return (float(gap[differ].mean()) if differ.any() else float("nan"),
            float(gap[~differ].mean()) if (~differ).any() else float("nan"))


def engine_time(model: Any, tokenizer: Any, record: bool, prompts: list[list[int]], n: int,
                new: int) -> tuple[float, float]:
    """Wall and CPU seconds (this process's, all threads) of the engine's generations."""
    import torch
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig

    engine = TransformersEngine(model, tokenizer, TransformersEngineConfig(record_routes=record, seed=0,
                                                                          device=str(model.device)))
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    generate(engine, prompts, n, new)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if engine._routing is not None:
        engine._routing.remove()
    return wall, cpu


def overhead_rounds(model: Any, tokenizer: Any, prompts: list[list[int]], n: int, new: int,
                    repeats: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Engine (wall, CPU) seconds without and with recording, one pair per round: a warm-up of each,
    then ``repeats`` rounds of off, on, on, off (each half of a round the faster of its two runs, so
    a load spike on the machine during one run is dropped and a steady drift hits both halves alike)."""
    for record in (False, True):
        engine_time(model, tokenizer, record, prompts, n, new)
    off: list[tuple[float, float]] = []
    on: list[tuple[float, float]] = []
    for _ in range(repeats):
        runs = {record: engine_time(model, tokenizer, record, prompts, n, new) for record in (False, True)}
        for record in (True, False):
            again = engine_time(model, tokenizer, record, prompts, n, new)
            runs[record] = (min(runs[record][0], again[0]), min(runs[record][1], again[1]))
        off.append(runs[False])
        on.append(runs[True])
    return off, on


def report(rows: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> str:
    """One line per engine dtype and trainer routing, the gap split by the no-replay routing differences."""
    lines = []
    for engine, own, r3 in rows:
        for name, row in (("own (no replay)", own), ("engine's (R3)", r3)):
            flipped, rest = split(row, own["differ"])
            lines.append([engine, name, f"{row['routes_differ']:.3f}", f"{row['lp_mismatch']:.2e}",
                          *("-" if math.isnan(x) else f"{x:.2e}" for x in (flipped, rest)), f"{row['k3_kl']:.2e}"])
    return table(["engine", "trainer routing", "tokens with a routing difference", "mean |lp trainer - engine|",
                  "… on tokens routed differently without replay", "… on the others", "k3 KL(engine || trainer)"],
                 lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smaller model and batch (about a minute)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-scale", type=float, default=2.0,
                        help="multiplies every expert's weights (module docstring); 1: the random model as built")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="engine and trainer on this device (the trainer stays float32)")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.experts, args.groups, args.new, args.repeats = 8, 16, 2, 24, 9

    from toolrl.model_sources import load_tokenizer, tiny_moe

    path = tiny_moe(num_hidden_layers=args.layers, num_experts=args.experts, num_experts_per_tok=args.top_k)
    tokenizer = load_tokenizer(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 150_000) for _ in range(args.prompt)] for _ in range(args.groups)]
    trainer = load(path, "float32", args.expert_scale, args.device)
    rows = []
    for dtype in ("float32", "bfloat16"):
        batch = sample(load(path, dtype, args.expert_scale, args.device), tokenizer, prompts, args.n, args.new,
                       args.device)
        rows.append((dtype, compare(trainer, batch, replay=False), compare(trainer, batch, replay=True)))
    _, without, with_r3 = rows[-1]
    flipped_without, _ = split(without, without["differ"])
    flipped_with, _ = split(with_r3, without["differ"])
    off, on = overhead_rounds(load(path, "bfloat16", args.expert_scale, args.device), tokenizer, prompts, args.n, args.new,
                              args.repeats)
    wall = [b[0] / a[0] for a, b in zip(off, on)]
    cpu = [b[1] / a[1] for a, b in zip(off, on)]

    print(machine())
    print(f"tiny-moe: {args.layers} layers, {args.experts} experts, top-{args.top_k}, expert weights × "
          f"{args.expert_scale:g} (sparse-block / attention output std: {without['expert_share']:.2f}); "
          f"{batch.response_mask.shape[0]} samples of {args.new} tokens after "
          f"{args.prompt}-token prompts; trainer float32")
    print(report(rows))
    print(table(["engine (bfloat16)", "median wall s", "median CPU s", "rounds"],
                [[name, median([t[0] for t in runs]), median([t[1] for t in runs]), len(runs)]
                 for name, runs in (("without recording", off), ("recording routes", on))]))
    print(f"per-round overhead, wall: {' '.join(f'{r - 1:+.3f}' for r in wall)}")
    print(f"per-round overhead, CPU: {' '.join(f'{r - 1:+.3f}' for r in cpu)}")
    print(f"float32 engine, mean |lp trainer - engine| without/with R3: {rows[0][1]['lp_mismatch']:.2e} / "
          f"{rows[0][2]['lp_mismatch']:.2e}")
    print(f"k3 KL with/without R3: {with_r3['k3_kl'] / without['k3_kl']:.2f}")
    print(f"lp mismatch with/without R3 on tokens routed differently: {flipped_with / flipped_without:.2f}")
    print(f"lp mismatch with/without R3: {with_r3['lp_mismatch'] / without['lp_mismatch']:.2f}")
    print(f"route recording overhead (wall time): {median(wall) - 1:.2f}")
    print(f"route recording overhead: {median(cpu) - 1:.2f}")


if __name__ == "__main__":
    main()
