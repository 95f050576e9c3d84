"""Sequence parallelism's memory: one long τ²-like trajectory, one GRPO step, on one rank and on two
ranks with ``trainer.sequence_parallel: 2`` (two processes, a gloo group), side by side in one run.

The model is ``benchmarks/prefix_sharing.py``'s ``--shape body`` (hidden 128, 8 layers, MLPs of
4,096: activations, not the 152k-vocabulary head, are most of the memory). Every process holds a whole
copy of the weights (no FSDP), so the per-process figure ``step MB`` — the step's peak RSS minus the
RSS just before it (``trainer_peak_mb``) — is the activations and the gradients, the same on both
sides but for the activations. The trajectory: a policy-and-tools prompt, then turns of assistant
text (trained) and tool output (not), ``--tokens`` in all.

Then the longest trajectory under a per-process cap: the cap is 1.05 × one rank's ``step MB`` at
``--tokens``; two sequence-parallel ranks run ``--tokens × 2`` and their ``step MB`` is compared with it.
Last line: ``activation memory per rank sp2/sp1: X.XX``.

    OMP_NUM_THREADS=1 python benchmarks/long_context.py [--tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from typing import Any

from _common import machine, single_thread, table

single_thread()

BODY = {"hidden_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 4096}


def trajectory(tokens: int) -> Any:
    """A τ²-like conversation of ``tokens``: 2,000 prompt tokens (policy, tool schemas), then turns of
    60-token assistant messages (trained) and 240-token tool results (not)."""
    from toolrl.trajectory import Trajectory

    rng = random.Random(0)
    prompt = [rng.randrange(100, 150_000) for _ in range(min(2000, tokens // 4))]
    response, mask = [], []
    while len(prompt) + len(response) < tokens:
        for n, trained in ((60, 1), (240, 0)):
            response += [rng.randrange(100, 150_000) for _ in range(n)]
            mask += [trained] * n
    keep = tokens - len(prompt)
    response, mask = response[:keep], mask[:keep]
    mask[-1] = 1  # the forward runs up to the last trained token
    return Trajectory(trajectory_id="long", sample_index=0, group=0, prompt_ids=prompt, response_ids=response,
                      response_mask=mask, logprobs=[-1.0] * len(response), reward=1.0)


def one_step(rank: int, world: int, port: int, tokens: int, out: str) -> None:
    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model, tiny_qwen3
    from toolrl.training.peakmem import rss_bytes
    from toolrl.training.step import StepOptions, train_step

    torch.set_num_threads(1)
    sp = None
    if world > 1:
        import torch.distributed as dist
        from toolrl.training.sequence_parallel import new_groups

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        sp = new_groups(rank, world, world)
    model = load_model(tiny_qwen3(**BODY))
    t = trajectory(tokens)
    # A reward away from the group's mean: one trajectory of a group of one still has advantage 0, so
    # the loss is -A·lp with A = 0; the step's memory is the same whatever A is.
    options = StepOptions(AlgorithmConfig(), OptimConfig(micro_batch_size=1), pad_id=0, temperature=1.0,
                          max_response_tokens=len(t.response_ids), rank=rank, world_size=world, sp=sp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    before = rss_bytes() / 2**20
    t0 = time.perf_counter()
    metrics = train_step(model, optimizer, [t], options)
    row = {"rank": rank, "step_mb": metrics["trainer_peak_mb"] - before, "step_s": time.perf_counter() - t0}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(row, f)
    if sp is not None:
        import torch.distributed as dist

        dist.destroy_process_group()


def run(world: int, tokens: int, scratch: str) -> dict[str, float]:
    """One step in ``world`` fresh processes; the largest rank's figures."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(scratch, f"w{world}-{tokens}")
    mp.spawn(one_step, args=(world, port, tokens, out), nprocs=world)
    rows = []
    for r in range(world):
        with open(f"{out}.{r}") as f:
            rows.append(json.load(f))
    return {"step_mb": max(r["step_mb"] for r in rows), "step_s": max(r["step_s"] for r in rows)}


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as scratch:
        sp1 = run(1, args.tokens, scratch)
        sp2 = run(2, args.tokens, scratch)
        cap = 1.05 * sp1["step_mb"]
        longer = run(2, 2 * args.tokens, scratch)
    rows = [["1 rank", f"{args.tokens:,}", f"{sp1['step_mb']:.0f}", f"{sp1['step_s']:.1f}"],
            ["2 ranks, sequence_parallel 2", f"{args.tokens:,}", f"{sp2['step_mb']:.0f}", f"{sp2['step_s']:.1f}"],
            ["2 ranks, sequence_parallel 2", f"{2 * args.tokens:,}", f"{longer['step_mb']:.0f}",
             f"{longer['step_s']:.1f}"]]
    print(table(["trainer", "tokens", "step MB per rank", "step s"], rows))
    fits = longer["step_mb"] <= cap
    print(f"cap {cap:.0f} MB per process (1.05 × one rank's step at {args.tokens:,} tokens): two ranks train "
          f"{2 * args.tokens:,} tokens under it: {'yes' if fits else 'no'} "
          f"(longest trajectory under the cap, sp2/sp1 ≥ {2.0 if fits else float('nan'):.1f})")
    print(f"activation memory per rank sp2/sp1: {sp2['step_mb'] / sp1['step_mb']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
