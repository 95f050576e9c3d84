"""A rule-following ledger agent, as a rollout engine: it reads its context and makes the calls a
model that had learnt the task would make (``read_page`` for the next unread page, then the answer;
asked for a summary, it writes one holding the audit key and the pages read; offered the ``fold``
policy's ``branch`` tool, it reads page 1 itself and every later page in branches of ``fold_pages``
pages, each answering how far it read). It stands in for a policy
where the tiny test model cannot make the calls (benchmarks/context_policies.py, the plugin's tests):
the loop, the chat template, the tool, the context policy and every token around it are real.

What it knows is only what its context shows: once page 1 leaves the context without a summary, it
cannot report the audit key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolrl.engines import Generation, RolloutEngine, SamplingParams

PAGE = re.compile(r"Ledger page (\d+) of (\d+)\.")
KEY = re.compile(r"[Aa]udit key(?: is|:) (\d+)")
READ = re.compile(r"Pages read: 1-(\d+) of (\d+)")
SUBTASK = re.compile(r"Sub-task: Read pages (\d+) to (\d+) of (\d+)\.")  # a branch's prompt (fold)
BRANCH_OFFERED = '"name": "branch"'  # the fold policy's tool, in the rendered tool schemas
LOGPROB = -0.5  # every scripted token's log-prob (the trainer recomputes its own)


class LedgerAgent(RolloutEngine):
    name = "ledger_agent"

    def __init__(self, tokenizer: Any, end_of_turn: str = "<|im_start|>", fold_pages: int = 2) -> None:
        self.tokenizer = tokenizer
        self.turn_marker = end_of_turn  # where each turn of the rendered context starts
        self.fold_pages = fold_pages  # pages per branch: 2 of about 1k tokens fit a 4096-token context

    @classmethod
    def create(cls, source: Any, config: Any) -> LedgerAgent:
        return cls(source.tokenizer)

    def act(self, context: str) -> str:
        """The next turn's text, from the context's text alone."""
        last_turn = context.rsplit(self.turn_marker, 2)[-2] if context.count(self.turn_marker) > 1 else context
        keys = KEY.findall(context)
        key = keys[-1] if keys else None
        read, pages = 0, None
        for n, total in PAGE.findall(context) + READ.findall(context):
            read, pages = max(read, int(n)), int(total)
        if last_turn.startswith("user") and "write a summary" in last_turn.lower():
            return f"Audit key: {key or 'unknown'}. Pages read: 1-{read} of {pages}."
        if (sub := SUBTASK.search(context)) is not None:  # in a branch: its pages, then how far it read
            first, last, total = map(int, sub.groups())
            done = max((int(n) for n, _ in PAGE.findall(context)), default=first - 1)
            return _call("read_page", n=done + 1) if done < last else f"Pages read: 1-{last} of {total}."
        if pages is None or read < pages:
            if read and BRANCH_OFFERED in context:
                last = min(read + self.fold_pages, pages)
                return _call("branch", task=f"Read pages {read + 1} to {last} of {pages}.")
            return _call("read_page", n=read + 1)
        return f"The audit key is {key}." if key else "I no longer know the audit key."

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None, images: Any = (), adapter: str | None = None) -> list[Generation]:
        if adapter is not None:
            raise ValueError(f"adapter {adapter!r}: the ledger agent serves no adapter per role")
        text = self.act(self.tokenizer.decode(list(prompt_ids)))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= params.max_new_tokens:
            ids = ids[:params.max_new_tokens]
            return [Generation(ids, [LOGPROB] * len(ids), "length")]
        ids.append(params.stop_token_ids[0])
        return [Generation(ids, [LOGPROB] * len(ids), "stop", params.stop_token_ids[0])]

    def update_weights(self, state_dict: Any) -> None:
        raise NotImplementedError("the ledger agent follows rules; it has no weights")


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
