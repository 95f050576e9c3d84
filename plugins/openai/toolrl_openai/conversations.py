"""Served conversations as token-exact trajectories.

An OpenAI client resends the whole conversation every turn. A request continues an open
conversation when its prompt tokens start with that conversation's prompt + everything generated
and added so far; the new tokens in between (the template's end of the last assistant turn, the
tool or user messages, the next generation prompt) join the trajectory with mask 0 and the
completion with mask 1 — the layout of ``rollouts/step_NNNNN.jsonl``. The conversation id also
serves as the engine's ``session_id``, so engines that keep KV caches reuse them across turns.

A conversation closes after ``idle_s`` without a request, when more than ``max_open`` are open
(least recently used first), or at shutdown; with a record directory, closing appends its row to
``DIR/trajectories.jsonl``.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.engines import Generation
from toolrl.schemas import ParseError
from toolrl.trajectory import Trajectory

RECORD_FILE = "trajectories.jsonl"


@dataclass
class Conversation:
    trajectory: Trajectory
    tokens: list[int]  # prompt_ids + response_ids: what a continuing request's prompt starts with
    last_used: float
    messages: list[Any] | None = None  # chat: the conversation so far, as message keys (see match_messages)

    @property
    def id(self) -> str:
        return self.trajectory.trajectory_id


@dataclass
class Match:
    """An open conversation a prompt continues, and how many tokens it held when matched."""

    conversation: Conversation
    length: int


def _history(traj: Trajectory, length: int) -> Trajectory:
    """A copy of ``traj`` as it was when prompt + response held ``length`` tokens."""
    keep = length - len(traj.prompt_ids)
    mask = traj.response_mask[:keep]
    turns = sum(1 for k, m in enumerate(mask) if m and (k == 0 or not mask[k - 1]))
    return traj.model_copy(deep=True, update={
        "response_ids": traj.response_ids[:keep], "response_mask": mask, "logprobs": traj.logprobs[:keep],
        "turns": turns, "model_text": traj.model_text[:turns]})


@dataclass
class Turn:
    """One generated choice, as the endpoint understood it."""

    generation: Generation
    text: str  # the generation's text as returned to the client
    final_response: str  # content (chat: outside tool calls)
    parse_errors: Sequence[ParseError] = ()
    messages: list[Any] | None = None  # chat: the conversation's message keys including this reply


class Conversations:
    def __init__(self, tokenizer: Any, record_dir: Path | None = None, idle_s: float = 600.0,
                 max_open: int = 4096, on_close: Callable[[str], None] | None = None) -> None:
        self.tokenizer = tokenizer
        self.record_file = None
        if record_dir is not None:
            record_dir.mkdir(parents=True, exist_ok=True)
            self.record_file = record_dir / RECORD_FILE
        self.idle_s = idle_s
        self.max_open = max_open
        self.on_close = on_close
        self._open: OrderedDict[str, Conversation] = OrderedDict()
        self._requests = itertools.count()

    def __len__(self) -> int:
        return len(self._open)

    def match(self, prompt_ids: Sequence[int]) -> Match | None:
        """The open conversation this prompt continues (the longest whose tokens it starts with)."""
        if not prompt_ids:
            return None
        best: Conversation | None = None
        for conv in self._open.values():
            n = len(conv.tokens)
            if n <= len(prompt_ids) and (best is None or n > len(best.tokens)) \
                    and conv.tokens[0] == prompt_ids[0] and conv.tokens[-1] == prompt_ids[n - 1] \
                    and list(prompt_ids[:n]) == conv.tokens:
                best = conv
        return None if best is None else Match(best, len(best.tokens))

    def match_messages(self, keys: Sequence[Any], is_assistant: Callable[[Any], bool]) -> tuple[Match, int] | None:
        """The open chat conversation whose messages (including the replies served) begin ``keys``,
        followed only by new non-assistant messages; and how many of ``keys`` it holds."""
        best: Conversation | None = None
        for conv in self._open.values():
            n = len(conv.messages or ())
            if n and n < len(keys) and (best is None or n > len(best.messages or ())) \
                    and list(keys[:n]) == conv.messages and not any(is_assistant(k) for k in keys[n:]):
                best = conv
        if best is None or best.messages is None:
            return None
        return Match(best, len(best.tokens)), len(best.messages)

    def session_for(self, base: Match | None, n: int) -> str | None:
        """The session id to generate under: the continued conversation's, a fresh one for a new
        single-choice request, none for several choices (each becomes its own conversation)."""
        if n != 1:
            return None
        return base.conversation.id if base is not None else f"conv-{uuid.uuid4().hex[:16]}"

    def add(self, prompt_ids: Sequence[int], turns: Sequence[Turn], base: Match | None,
            session_id: str | None, images: Sequence[Any] = ()) -> list[str]:
        """Append each choice to its conversation. The first continues ``base`` unless another
        request extended or closed it meanwhile; every other choice forks: a new conversation with
        ``base``'s history as it was when matched. ``images``: a new conversation's prompt images
        (toolrl.trajectory.TrajectoryImage; a prompt with images continues none)."""
        request = next(self._requests)
        now = time.monotonic()
        history = None if base is None else _history(base.conversation.trajectory, base.length)
        ids = []
        for i, turn in enumerate(turns):
            if i == 0 and base is not None and base.conversation.id in self._open \
                    and len(base.conversation.tokens) == base.length:
                conv = base.conversation
            else:
                fresh = i == 0 and session_id is not None and session_id not in self._open
                tid = session_id if fresh and session_id is not None else f"conv-{uuid.uuid4().hex[:16]}"
                if history is None:
                    traj = Trajectory(trajectory_id=tid, sample_index=request, group=request,
                                      prompt_ids=list(prompt_ids), images=list(images))
                else:
                    traj = history.model_copy(deep=True, update={"trajectory_id": tid, "group": request})
                conv = Conversation(traj, list(traj.prompt_ids) + list(traj.response_ids), now)
            self._extend(conv, prompt_ids, turn)
            conv.last_used = now
            self._open[conv.id] = conv
            self._open.move_to_end(conv.id)
            ids.append(conv.id)
        while len(self._open) > self.max_open:
            self.close(next(iter(self._open)))
        return ids

    @staticmethod
    def _extend(conv: Conversation, prompt_ids: Sequence[int], turn: Turn) -> None:
        traj, gen = conv.trajectory, turn.generation
        delta = list(prompt_ids[len(conv.tokens):])
        traj.response_ids += delta + list(gen.token_ids)
        traj.response_mask += [0] * len(delta) + [1] * len(gen.token_ids)
        traj.logprobs += [0.0] * len(delta) + list(gen.logprobs)
        traj.turns += 1
        traj.model_text.append(turn.text)
        traj.final_response = turn.final_response
        traj.parse_errors += list(turn.parse_errors)
        traj.termination = "length" if gen.finish_reason == "length" else "answered"
        conv.tokens += delta + list(gen.token_ids)
        conv.messages = list(turn.messages) if turn.messages is not None else None

    def expire(self, now: float | None = None) -> int:
        """Close conversations idle for ``idle_s``; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [cid for cid, c in self._open.items() if now - c.last_used >= self.idle_s]
        for cid in idle:
            self.close(cid)
        return len(idle)

    def close(self, conversation_id: str) -> None:
        conv = self._open.pop(conversation_id, None)
        if conv is None:
            return
        if self.on_close is not None:
            self.on_close(conversation_id)
        if self.record_file is not None:
            self._write(conv.trajectory)

    def close_all(self) -> None:
        for cid in list(self._open):
            self.close(cid)

    def _write(self, traj: Trajectory) -> None:
        # The row layout of rollouts/step_NNNNN.jsonl, less what a served conversation does not have:
        # a reward (nobody scored it) and a GRPO group (training groups rows by prompt; toolrl.data.recorded).
        row = traj.model_dump(mode="json", exclude={"model_text", "reward", "reward_terms", "tool_rewards", "group"})
        row["prompt_text"] = self.tokenizer.decode(traj.prompt_ids, skip_special_tokens=False)
        row["response_text"] = self.tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        assert self.record_file is not None
        with self.record_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
