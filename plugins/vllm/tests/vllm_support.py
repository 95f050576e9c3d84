"""Reference computations shared by the tests (imported by file name: tests/ is on sys.path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


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
