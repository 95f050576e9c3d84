"""A teacher's scoring: the transformers engine's ``prompt_logprobs`` over whole sequences against the same
call from the response's first token (``start``), where the LM head and log-softmax skip the prompt.

The tiny random Qwen3 on the CPU scores ``--rows`` sequences of ``--prompt`` prompt tokens and
``--response`` response tokens (a teacher's batch); each arm is timed ``--repeats`` times, alternating,
after one warm-up each; the medians are printed and the results checked equal on the scored tokens.

    OMP_NUM_THREADS=1 python benchmarks/teacher_scoring.py [--rows 8] [--prompt 64] [--response 32]

Last line: ``whole/start: X.XX`` (above 1: scoring from the start is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from _common import machine, median, single_thread


async def measure(args: argparse.Namespace) -> float:
    import torch
    from toolrl.engines import ModelSource
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.model_sources import tiny_qwen3

    single_thread()
    path = tiny_qwen3()
    engine = TransformersEngine.create(ModelSource(path=path), {"device": "cpu", "max_batch_size": args.rows})
    g = torch.Generator().manual_seed(0)
    size = args.prompt + args.response
    seqs = [torch.randint(0, 1000, (size,), generator=g).tolist() for _ in range(args.rows)]
    arms = {"whole": {}, "start": {"start": args.prompt}}
    times: dict[str, list[float]] = {k: [] for k in arms}
    out = {}
    try:
        for k, extra in arms.items():  # warm-up
            out[k] = await engine.prompt_logprobs(seqs, args.top, **extra)
        for _ in range(args.repeats):
            for k, extra in arms.items():
                t = time.perf_counter()
                await engine.prompt_logprobs(seqs, args.top, **extra)
                times[k].append(time.perf_counter() - t)
    finally:
        await engine.close()
    for w, s in zip(out["whole"], out["start"], strict=True):
        assert (s.logprobs, s.top) == (w.logprobs[args.prompt - 1:], w.top[args.prompt - 1:])
    print(machine())
    print(f"{args.rows} sequences of {args.prompt} prompt + {args.response} scored tokens, top {args.top}")
    for k in arms:
        print(f"{k:>6}: median {median(times[k]) * 1e3:.1f} ms over {args.repeats}")
    return median(times["whole"]) / median(times["start"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=32)
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    single_thread()
    ratio = asyncio.run(measure(args))
    print(f"whole/start: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
