"""What serving costs: the same generations with the transformers engine in this process (the anchor)
and through `toolrl serve` (same engine and model, another process) with the `openai` engine over
HTTP — token-exact, so both return ids and logprobs.

    OMP_NUM_THREADS=1 python benchmarks/openai_overhead.py [--requests 16] [--tokens 32] [--rounds 3]

Each round runs `--requests` concurrent single-sample requests of `--tokens` new tokens (greedy,
tiny random Qwen3) on both paths, interleaved, and prints per path the median wall time and
generated tokens/s, and the ratio served/in-process. Needs toolrl-plugin-openai.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    out = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "toolrl", "serve", str(ROOT / "examples" / "tiny.yaml"),
                             "--port", "0"], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        m = re.search(r"serving \S+ at (http://\S+/v1)", log.read_text())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"toolrl serve failed:\n{log.read_text()}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("toolrl serve did not start")


async def run(engine: object, prompts: list[list[int]], params: object) -> tuple[float, int]:
    t = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))  # type: ignore[attr-defined]
    return time.perf_counter() - t, sum(len(g[0].token_ids) for g in gens)


async def main_async(args: argparse.Namespace) -> None:
    from toolrl import model_sources
    from toolrl.engines import ModelSource, SamplingParams
    from toolrl.engines.transformers import TransformersEngine
    from toolrl_openai.engine import OpenAIEngine

    path = model_sources.tiny_qwen3()
    tokenizer = model_sources.load_tokenizer(path)
    prompts = [tokenizer.encode(f"Question {i}: what is {i} + {i}?", add_special_tokens=False)
               for i in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_new_tokens=args.tokens)  # no stop: every request runs full
    local = TransformersEngine.create(ModelSource(path, tokenizer=tokenizer), {"device": "cpu"})
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp) / "serve.log")
        remote = OpenAIEngine.create(ModelSource(path, tokenizer=tokenizer), {"base_url": url})
        try:
            await run(local, prompts[:2], params)  # warm both paths
            await run(remote, prompts[:2], params)
            times: dict[str, list[float]] = {"in-process transformers engine": [], "toolrl serve + openai engine": []}
            tokens = 0
            for _ in range(args.rounds):
                for name, engine in zip(times, (local, remote)):
                    wall, tokens = await run(engine, prompts, params)
                    times[name].append(wall)
        finally:
            await remote.close()
            await local.close()
            proc.terminate()
            proc.wait()
    anchor = statistics.median(times["in-process transformers engine"])
    print(f"{args.requests} concurrent requests x {args.tokens} tokens, tiny random Qwen3, {args.rounds} rounds")
    print(f"{'path':<34} {'median s':>9} {'tokens/s':>9} {'x anchor':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<34} {med:9.2f} {tokens / med:9.1f} {med / anchor:9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
