"""What recording the trainer's per-token log-probs (``trainer_logprobs`` in the trace rows) adds to a
GRPO step: the time :class:`toolrl.training.step.ProximalLogprobs` spends keeping them (one copy of each
micro-batch's log-prob grid to the host, turned into per-trajectory lists) against the whole
``train_step`` it runs inside, measured in the same steps, and the bytes they add to a trace row.

The model is the tiny random Qwen3 (``examples/tiny.yaml``'s), the batch tiny.yaml's shape (2 groups of
4 trajectories, micro-batches of 4): ``--response`` tokens each after a 150-token prompt, the middle
third a tool result (not trained). Last line: ``recording / step: X.XXXXX``.

    OMP_NUM_THREADS=1 python benchmarks/trainer_logprobs.py [--response 96] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from _common import machine, median, single_thread, table

single_thread()


def batch(response: int) -> list[Any]:
    from toolrl.trajectory import Trajectory

    rng = random.Random(0)
    third = response // 3
    mask = [1] * third + [0] * third + [1] * (response - 2 * third)
    return [Trajectory(trajectory_id=f"t{i}", sample_index=i // 4, group=i // 4,
                       prompt_ids=[rng.randrange(100, 150_000) for _ in range(150)],
                       response_ids=[rng.randrange(100, 150_000) for _ in range(response)], response_mask=mask,
                       logprobs=[-12.0 if m else 0.0 for m in mask], reward=float(i % 2)) for i in range(8)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--response", type=int, default=96)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model, tiny_qwen3
    from toolrl.training import step as step_module

    single_thread()
    spent: list[float] = []
    keep = step_module.ProximalLogprobs.add

    def timed(self: Any, micro: Any, prox_lp: Any) -> None:
        t0 = time.perf_counter()
        keep(self, micro, prox_lp)
        spent.append(time.perf_counter() - t0)

    step_module.ProximalLogprobs.add = timed  # type: ignore[method-assign]
    model = load_model(tiny_qwen3())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    options = step_module.StepOptions(AlgorithmConfig(loss_agg="token-mean"), OptimConfig(micro_batch_size=4),
                                      pad_id=0, temperature=1.0, max_response_tokens=args.response)
    trajs = batch(args.response)
    rows = []
    step_s, record_s = [], []
    out: dict[str, Any] = {}
    for k in range(args.steps + 1):  # the first step warms up
        spent.clear()
        t0 = time.perf_counter()
        out = step_module.train_step(model, optimizer, trajs, options)
        if k:
            step_s.append(time.perf_counter() - t0)
            record_s.append(sum(spent))
    row_bytes = [len(json.dumps(t.model_dump(mode="json"))) for t in trajs]
    lp_bytes = [len(json.dumps(out["trainer_logprobs"][t.trajectory_id])) for t in trajs]
    rows.append(["train_step (s)", median(step_s)])
    rows.append(["of it recording (ms)", 1e3 * median(record_s)])
    rows.append(["trajectory record (bytes, mean)", sum(row_bytes) / len(row_bytes)])
    rows.append(["of it trainer_logprobs (bytes, mean)", sum(lp_bytes) / len(lp_bytes)])
    print(machine())
    print(f"8 trajectories of 150 + {args.response} tokens, {args.steps} steps (medians)")
    print(table(["figure", "value"], rows))
    print(f"recording / step: {median(record_s) / median(step_s):.5f}")


if __name__ == "__main__":
    main()
