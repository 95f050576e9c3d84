"""Reference computations shared by the tests (imported by file name: tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import torch
from toolrl.engines import SamplingParams

# What the weight-transport tests sample (test_weight_transport.py): seeded, so an engine's samples
# are a function of its weights alone, compared bit for bit.
SYNC_TEXTS = ("hi", "What is 17 * 23?")
SYNC_PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)


def sync_prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          return_dict=False) for t in SYNC_TEXTS]


async def samples(engine: Any, prompts: Sequence[list[int]]) -> list[tuple[list[int], list[float]]]:
    """``engine``'s tokens and log-probs for each prompt under :data:`SYNC_PARAMS`."""
    return [(g.token_ids, g.logprobs) for p in prompts for g in await engine.generate(p, SYNC_PARAMS)]


@torch.no_grad()
def reference_logprobs(model: Any, prompt: Sequence[int], tokens: Sequence[int], temperature: float = 1.0,
                       ) -> tuple[list[float], list[int]]:
    """Teacher-forced transformers logprobs of ``tokens`` after ``prompt`` under
    ``log_softmax(logits / temperature)`` (the trainer's definition), and the argmax at each step."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    start = len(prompt) - 1
    logits = model(ids).logits[0, start:start + len(tokens)].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, -1)
    picked = lp.gather(-1, torch.tensor(list(tokens))[:, None])[:, 0]
    return picked.tolist(), lp.argmax(-1).tolist()


async def decoding(engine: Any, tokens: int, timeout: float = 120.0) -> int:
    """Once the one request in flight on ``engine`` has decoded at least ``tokens`` tokens (as vLLM's own
    output processor counts what its engine core streamed back, read on the engine's loop), how many it
    has: a test acts mid-request at a known point instead of after a guessed sleep."""

    async def counts() -> list[int]:
        states = engine._llm.output_processor.request_states.values()
        return [state.detokenizer.num_output_tokens() for state in states]

    deadline = time.monotonic() + timeout
    while True:
        done = await engine._thread.run(counts())
        if len(done) > 1:
            raise AssertionError(f"{len(done)} requests in flight, expected one")
        if done and done[0] >= tokens:
            return done[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no request decoded {tokens} tokens within {timeout} s: {done}")
        await asyncio.sleep(0.005)  # poll: the engine streams nothing to the caller before the end
