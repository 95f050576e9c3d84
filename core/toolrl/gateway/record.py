"""An episode's model calls as one trajectory, token-exact (docs/agents.md, "What is trained").

A program resends its conversation re-serialised its own way, so each call is matched by *message keys*
(:func:`toolrl.gateway.protocol.message_key`: what the messages say, not how) to a **segment**, a piece of
the trajectory whose tokens are held as generated:

- a call whose messages are a segment's (its replies as served) followed only by new non-assistant
  messages continues it: their rendering is appended (mask 0), then the generation (mask 1);
- any other call (history rewritten, a sub-agent, the segment busy generating, another role's segment)
  opens a new segment, its prompt rendered from its messages;
- a call for ``n`` choices continues with the first; each other choice opens a segment of its own.

Every sampled token is in exactly one segment; at the end the segments are the trajectory's pieces, the
one that answered last the last (:meth:`EpisodeRecord.pieces`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.engines import Generation
from toolrl.gateway.protocol import is_assistant_key
from toolrl.renderers.chat import ChatRenderer, TemplateError
from toolrl.schemas import ParseError
from toolrl.trajectory import Termination, Trajectory, append_tokens, cut_response, model_tokens_end, part_id


@dataclass
class Segment:
    traj: Trajectory
    renderer: ChatRenderer  # its tools' renderer
    tools: str  # the calls' tools, as JSON: a call continues a segment only with the same tools
    keys: list[str]  # the messages its tokens hold, the replies served included
    finished: bool = False  # its tokens end in a finished assistant turn (an end token): a call may continue it
    busy: bool = False  # a call is generating in it
    answered: int = -1  # when it last generated (the last piece is the segment that answered last)


@dataclass
class Call:
    """One request, placed: the segment it generates in, its prompt, and the segment's length before
    the request's messages were appended (to take them back if it fails)."""

    segment: Segment
    keys: list[str]
    before: int
    abandoned: bool = False  # taken back (failed, given up, or no token left): nothing of it is recorded

    @property
    def prompt_ids(self) -> list[int]:
        traj = self.segment.traj
        return traj.prompt_ids + traj.response_ids


@dataclass
class EpisodeRecord:
    key: str  # the trajectory's key
    sample_index: int
    group: int
    env: str | None = None
    ground_truth: Any = None
    segments: list[Segment] = field(default_factory=list)
    final_response: str = ""
    last_finish: str = ""
    calls: int = 0  # generation calls made: the turn counter of the episode's seeds
    ended: bool = False  # its trajectory was made: a generation still in flight then is not recorded
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _answers: Iterator[int] = field(default_factory=itertools.count)

    @property
    def response_tokens(self) -> int:
        return sum(len(s.traj.response_ids) for s in self.segments)

    def place(self, keys: list[str], tools: str, renderer: ChatRenderer, messages: Sequence[dict[str, Any]],
              role: str | None = None) -> Call:
        """The segment a request with message ``keys`` (its ``messages`` as the template takes them)
        by ``role`` generates in; the new messages' tokens are appended to a continued one."""
        segment = self._continued(keys, tools, role)
        if segment is not None:
            before = len(segment.traj.response_ids)
            try:
                delta = renderer.tool_delta(list(messages[len(segment.keys):]))
            except TemplateError:  # a template that cannot append these messages: render them whole
                segment = None
            else:
                append_tokens(segment.traj, delta, [0] * len(delta), [0.0] * len(delta))
        if segment is None:
            segment = self._open(renderer.prompt_ids(list(messages)), renderer, tools, keys, role)
            before = 0
        segment.busy = True
        return Call(segment, keys, before)

    def _continued(self, keys: list[str], tools: str, role: str | None) -> Segment | None:
        """The longest finished, idle segment of these tools and role that ``keys`` extend without an
        assistant turn (the first of equals); None when none does."""
        return max((s for s in self.segments if s.finished and not s.busy and s.tools == tools and s.traj.role == role
                    and len(s.keys) < len(keys) and keys[:len(s.keys)] == s.keys
                    and not any(is_assistant_key(k) for k in keys[len(s.keys):])),
                   key=lambda s: len(s.keys), default=None)

    def _open(self, prompt_ids: list[int], renderer: ChatRenderer, tools: str, keys: list[str],
              role: str | None) -> Segment:
        traj = Trajectory(trajectory_id=part_id(self.key, "segment", next(self._ids)), sample_index=self.sample_index,
                          group=self.group, env=self.env, prompt_ids=list(prompt_ids), ground_truth=self.ground_truth,
                          role=role)
        segment = Segment(traj, renderer, tools, list(keys))
        self.segments.append(segment)
        return segment

    def abandon(self, call: Call) -> None:
        """Take a failed request's messages back out of its segment."""
        cut_response(call.segment.traj, call.before)
        call.segment.busy, call.abandoned = False, True

    def record(self, call: Call, gens: Sequence[Generation], replies: Sequence[str], texts: Sequence[str],
               errors: Sequence[Sequence[ParseError]], answer: str) -> None:
        """The generations of ``call`` (choice ``i`` with its reply's key ``replies[i]``, its text and
        parse errors): the first joins the call's segment, every other opens one. Nothing, once the
        episode ended (its pieces are the trajectory already)."""
        if self.ended:
            return
        prompt = call.prompt_ids
        for i, gen in enumerate(gens):
            segment = call.segment if i == 0 else self._open(prompt, call.segment.renderer, call.segment.tools,
                                                             call.keys, call.segment.traj.role)
            traj = segment.traj
            append_tokens(traj, gen.token_ids, [1] * len(gen.token_ids), gen.logprobs)
            traj.turns += 1
            traj.model_text.append(texts[i])
            traj.parse_errors += list(errors[i])
            traj.policy_versions.append(gen.weight_version)
            traj.prefill_tokens_saved += gen.prefill_tokens_saved
            if gen.routed_experts is not None:  # they cover the whole context the engine ran
                traj.routed_experts = gen.routed_experts
            segment.keys = [*call.keys, replies[i]]
            # Ended by an end-of-turn token (as a token, or as the stop string it also is): a turn the
            # template's next messages follow.
            segment.finished = bool(gen.token_ids) and gen.token_ids[-1] in segment.renderer.stop_ids
            segment.answered = next(self._answers)
        call.segment.busy = False
        self.calls += 1
        self.final_response, self.last_finish = answer, gens[0].finish_reason if gens else ""

    def pieces(self, termination: Termination) -> list[Trajectory]:
        """The trajectory: every segment that holds a sampled token, cut after its last one, in the
        order they were opened, the one that answered last at the end (with ``termination``; the
        others ``forked``). The episode ends: a call still generating is not recorded."""
        self.ended = True
        live = [s for s in self.segments if any(s.traj.response_mask)]
        if not live:
            return []
        last = max(live, key=lambda s: s.answered)
        out = [s.traj for s in live if s is not last] + [last.traj]
        for k, traj in enumerate(out):
            cut_response(traj, model_tokens_end(traj.response_mask))
            final = k == len(out) - 1
            traj.trajectory_id = self.key if final else part_id(self.key, "piece", k)
            traj.trajectory_key = self.key if len(out) > 1 else ""
            traj.piece = k
            traj.termination = termination if final else "forked"
        out[-1].final_response = self.final_response
        return out
