"""A trajectory file (``rollouts/step_NNNNN.jsonl``, an evaluation's ``results.jsonl``) as a byte-offset
index: one pass records where each row starts and the few fields the table filters and sorts on; a
page of the table and an opened trajectory are then read from disk by offset. Nothing holds a whole
file of token ids in memory.

A row is one *piece* of a trajectory: a trajectory that a context policy edited, a template fork cut or
a fold branch left is saved as several rows sharing its ``trajectory_key``, each with its ``piece``
(toolrl.rollout.segments, toolrl.rollout.branches). The table lists whole trajectories
(:class:`TrajectorySummary`), their pieces grouped by key, with figures true for all of it.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

TRUNCATED = frozenset({"max_turns", "max_response_tokens", "length"})
SORT_KEYS = ("row", "reward", "advantage", "turns", "tool_calls", "tool_failures", "response_tokens", "group")


@dataclass(frozen=True)
class RowSummary:
    """What the table shows and filters on for one trajectory."""

    row: int
    offset: int
    trajectory_id: str
    group: int
    problem: int  # an evaluation's problem (results.jsonl), else the sample's index
    env: str
    reward: float | None  # None: not finite
    advantage: float | None  # a per-token advantage is summarised by its mean over trained tokens
    turns: int
    termination: str
    error: bool  # the trajectory or one of its reward functions failed
    infra_failure: bool  # the infrastructure failed (termination infra_error): not trained
    tool_calls: int
    tool_failures: int  # failed calls, malformed calls and lifecycle errors
    forked: bool
    response_tokens: int
    success: bool | None  # an evaluation's verdict (results.jsonl); None in training traces
    key: str = ""  # the whole trajectory's id, shared by its segments (pieces)
    piece: int = 0
    edit: str = ""  # the context edit that opened this segment (toolrl.context), in words
    keyed: bool = False  # the row names its trajectory_key: a piece, grouped with the others of its key
    trained_tokens: int = 0  # response tokens with mask 1 (weights the piece's advantage in its trajectory's)


@dataclass(frozen=True)
class TrajectorySummary:
    """One row of the table: a whole trajectory, its pieces (trace rows sharing its ``trajectory_key``;
    one row for a trajectory never cut) in piece order, with figures true for all of it
    (:func:`whole`)."""

    row: int  # its first row in the file: the table's file order
    offset: int
    trajectory_id: str  # the trajectory's key (its id, for a trajectory in one piece)
    rows: tuple[int, ...]  # its pieces' rows, in piece order
    segments: int
    group: int
    problem: int
    env: str
    reward: float | None
    advantage: float | None
    turns: int
    termination: str
    error: bool
    infra_failure: bool
    tool_calls: int
    tool_failures: int
    forked: bool
    response_tokens: int
    success: bool | None


def whole(pieces: list[RowSummary]) -> TrajectorySummary:
    """The trajectory of ``pieces`` (in piece order). What each piece holds (toolrl.rollout.segments,
    branches and reward.score_pieces): a main-line segment closed by a context edit or a template fork
    keeps its own tokens only (turns 0, no tool results, termination ``forked``); the main line's turns,
    tool results, parse and tool errors and termination sit on its last piece; a fold branch's piece
    holds the branch's own turns and tool results, which the main line does not count; every piece
    carries the trajectory's reward. So:

    - summed over pieces: turns, tool calls, tool failures, response tokens (every generated token is in
      exactly one piece);
    - from the last piece: reward, termination (and from it ``infra_failure``), success;
    - from the first: group, problem, environment (its pieces share them);
    - any piece: ``error``;
    - advantage: the mean over all pieces' trained tokens (a piece's own figure, when it is the only one
      with an advantage, or when every piece has the same).
    """
    first, last = pieces[0], pieces[-1]
    return TrajectorySummary(
        row=min(p.row for p in pieces), offset=min(p.offset for p in pieces), trajectory_id=first.key,
        rows=tuple(p.row for p in pieces), segments=len(pieces), group=first.group, problem=first.problem,
        env=first.env, reward=last.reward, advantage=_whole_advantage(pieces),
        turns=sum(p.turns for p in pieces), termination=last.termination, error=any(p.error for p in pieces),
        infra_failure=last.infra_failure, tool_calls=sum(p.tool_calls for p in pieces),
        tool_failures=sum(p.tool_failures for p in pieces), forked=len(pieces) > 1 or any(p.forked for p in pieces),
        response_tokens=sum(p.response_tokens for p in pieces), success=last.success,
    )


def _whole_advantage(pieces: list[RowSummary]) -> float | None:
    found = [(p.advantage, p.trained_tokens) for p in pieces if p.advantage is not None]
    if not found:
        return None
    if len({a for a, _ in found}) == 1:  # one piece, or the same figure on each (a per-trajectory estimator)
        return found[0][0]
    weight = sum(n for _, n in found)
    return sum(a * n for a, n in found) / weight if weight else sum(a for a, _ in found) / len(found)


def segment_label(position: int, count: int, piece: RowSummary) -> str:
    """A segment's heading in the opened trajectory: its place, and what opened it."""
    head = f"segment {position + 1} of {count}"
    if piece.edit:
        return f"{head}: opened by {piece.edit}"
    return f"{head}: the start" if position == 0 else f"{head}: a template fork (the conversation re-rendered)"


def edit_note(edit: Any) -> str:
    """A context edit (a trace row's ``edit``) in words: what the policy did, at which turn."""
    if not isinstance(edit, dict):
        return ""
    if edit.get("action") == "fold":  # a branch: the sub-task it ran, what it returned to the main line
        return (f"{edit.get('policy')}: branch called at main-line turn {edit.get('turn')} (main context "
                f"{edit.get('tokens_before')} tokens, branch prompt {edit.get('tokens_after')}); sub-task: "
                f"{edit.get('task')}; returned: {edit.get('result')}")
    removed = len(edit.get("removed") or [])
    note = (f"{edit.get('policy')}: {edit.get('action')} at turn {edit.get('turn')}, {removed} messages removed or "
            f"replaced, context {edit.get('tokens_before')} → {edit.get('tokens_after')} tokens")
    return note + (f"; summary: {edit['summary']}" if edit.get("summary") else "")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _advantage(value: Any, mask: list[int]) -> float | None:
    if isinstance(value, list):
        trained = [a for a, m in zip(value, mask) if m and _number(a) is not None]
        return sum(trained) / len(trained) if trained else None
    return _number(value)


# The long lists of numbers in a row, cut out before the row is parsed for its summary (4× faster on
# rows of ~1,000 tokens). A quote inside a JSON string is escaped, so these keys never match text.
NUMBER_LISTS = re.compile(rb'"(prompt_ids|response_ids|response_mask|logprobs|trainer_logprobs)": \[([^\]]*)\]')


def light_row(line: bytes) -> dict[str, Any]:
    """``line`` parsed without its token lists; ``response_tokens`` holds the response's length. A
    per-token advantage needs the mask, and a line the cut does not leave valid is parsed whole."""
    if b'"advantage": [' not in line:
        lengths: dict[bytes, int] = {}

        def cut(m: re.Match[bytes]) -> bytes:
            lengths[m.group(1)] = m.group(2).count(b",") + 1 if m.group(2).strip() else 0
            if m.group(1) == b"response_mask":  # its values are 0 and 1: the ones are the trained tokens
                lengths[b"trained"] = m.group(2).count(b"1")
            return b'"' + m.group(1) + b'": []'

        try:
            row = json.loads(NUMBER_LISTS.sub(cut, line))
        except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
            row = None
        if isinstance(row, dict):
            row["response_tokens"] = lengths.get(b"response_ids", 0)
            row["trained_tokens"] = lengths.get(b"trained", 0)
            return row
    return json.loads(line)


def summarize(row: dict[str, Any], index: int, offset: int) -> RowSummary:
    results = row.get("tool_results") or []
    failed = sum(r.get("status") != "ok" for r in results)
    return RowSummary(
        row=index, offset=offset, trajectory_id=str(row.get("trajectory_id", index)),
        group=int(row.get("group") or 0), problem=int(row.get("problem", row.get("sample_index")) or 0),
        env=str(row.get("env") or ""),
        reward=_number(row.get("reward")), advantage=_advantage(row.get("advantage"), row.get("response_mask") or []),
        turns=int(row.get("turns") or 0), termination=str(row.get("termination") or ""),
        error=row.get("error") is not None or bool(row.get("reward_errors")),
        infra_failure=row.get("termination") == "infra_error",
        tool_calls=len(results),
        tool_failures=failed + len(row.get("parse_errors") or []) + len(row.get("tool_errors") or {}),
        forked=row.get("termination") == "forked" or bool(row.get("piece")),
        response_tokens=row.get("response_tokens", len(row.get("response_ids") or [])),
        success=row.get("success") if isinstance(row.get("success"), bool) else None,
        key=str(row.get("trajectory_key") or row.get("trajectory_id", index)), piece=int(row.get("piece") or 0),
        edit=edit_note(row.get("edit")), keyed=bool(row.get("trajectory_key")),
        trained_tokens=row.get("trained_tokens", sum(m == 1 for m in row.get("response_mask") or [])),
    )


class TraceQuery(BaseModel):
    """A page of the table: filters, order and window (the page's query string)."""

    min_reward: float | None = None
    max_reward: float | None = None
    errors: bool = False
    infra_failures: bool = False
    tool_failures: bool = False
    truncated: bool = False
    forked: bool = False
    env: str = ""
    sort: Literal["row", "reward", "advantage", "turns", "tool_calls", "tool_failures", "response_tokens",
                  "group"] = "row"
    desc: bool = False
    offset: int = Field(0, ge=0)
    limit: int = Field(50, ge=1, le=500)

    def keep(self, s: TrajectorySummary) -> bool:
        if self.min_reward is not None and (s.reward is None or s.reward < self.min_reward):
            return False
        if self.max_reward is not None and (s.reward is None or s.reward > self.max_reward):
            return False
        return ((not self.errors or s.error) and (not self.infra_failures or s.infra_failure)
                and (not self.tool_failures or s.tool_failures > 0)
                and (not self.truncated or s.termination in TRUNCATED) and (not self.forked or s.forked)
                and (not self.env or s.env == self.env))


class TraceIndex:
    """The index of one trajectory file, rebuilt when the file changes (a step file is written whole,
    by an atomic rename; a file still growing is indexed up to its last complete line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._rows: list[RowSummary] = []
        self._trajectories: list[TrajectorySummary] = []
        self._by_key: dict[str, TrajectorySummary] = {}
        self._by_row: dict[int, TrajectorySummary] = {}

    def rows(self) -> list[RowSummary]:
        """Every row (piece) of the file, in file order."""
        return self._current()[0]

    def trajectories(self) -> list[TrajectorySummary]:
        """Every trajectory of the file, its pieces grouped, in the order of their first rows."""
        return self._current()[1]

    def _current(self) -> tuple[list[RowSummary], list[TrajectorySummary]]:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._rows, self._stamp = self._build(), stamp
                self._trajectories = group(self._rows)
                self._by_row = {r: t for t in self._trajectories for r in t.rows}
                self._by_key = {}
                for t in self._trajectories:  # two unkeyed rows with one id: the first answers to it
                    self._by_key.setdefault(t.trajectory_id, t)
            return self._rows, self._trajectories

    def _build(self) -> list[RowSummary]:
        rows: list[RowSummary] = []
        offset = 0
        with self.path.open("rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break  # being appended
                if line.strip():
                    try:
                        row = light_row(line)
                    except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
                        row = None
                    if isinstance(row, dict):
                        rows.append(summarize(row, len(rows), offset))
                offset += len(line)
        return rows

    def page(self, query: TraceQuery) -> dict[str, Any]:
        """A page of whole trajectories; ``total`` counts trajectories, ``pieces`` the file's rows."""
        rows, trajectories = self._current()
        kept = [t for t in trajectories if query.keep(t)]
        if query.sort != "row":
            # Rows without the figure (a non-finite reward, no advantage) go last either way.
            present = [t for t in kept if getattr(t, query.sort) is not None]
            missing = [t for t in kept if getattr(t, query.sort) is None]
            kept = sorted(present, key=lambda t: getattr(t, query.sort), reverse=query.desc) + missing
        elif query.desc:
            kept.reverse()
        window = kept[query.offset:query.offset + query.limit]
        return {"total": len(trajectories), "pieces": len(rows), "matched": len(kept), "offset": query.offset,
                "envs": sorted({t.env for t in trajectories if t.env}),
                "rows": [{k: v for k, v in asdict(t).items() if k != "offset"} for t in window]}

    def trajectory(self, key: str) -> TrajectorySummary:
        """Trajectory ``key`` (its ``trajectory_key``, or the id of a trajectory in one piece)."""
        self._current()
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"{self.path.name} has no trajectory {key!r}") from None

    def trajectory_of(self, row: int) -> TrajectorySummary:
        """The trajectory row ``row`` is a piece of."""
        self._current()
        try:
            return self._by_row[row]
        except KeyError:
            raise KeyError(f"{self.path.name} has no row {row}") from None

    def segments_of(self, key: str) -> list[dict[str, Any]]:
        """The segments of trajectory ``key``: :meth:`segments`."""
        return self.segments(self.trajectory(key))

    def segments(self, found: TrajectorySummary) -> list[dict[str, Any]]:
        """The segments (pieces) of trajectory ``found`` in order: row, piece, the edit that opened it,
        how it ended, its response tokens, its label."""
        rows = self.rows()
        return [{"row": r, "piece": rows[r].piece, "edit": rows[r].edit, "termination": rows[r].termination,
                 "response_tokens": rows[r].response_tokens, "label": segment_label(k, found.segments, rows[r])}
                for k, r in enumerate(found.rows)]

    def read(self, row: int) -> dict[str, Any]:
        """Row ``row`` in full, read at its offset."""
        rows = self.rows()
        if not 0 <= row < len(rows):
            raise KeyError(f"{self.path.name} has no row {row}")
        with self.path.open("rb") as f:
            f.seek(rows[row].offset)
            return json.loads(f.readline())


def group(rows: list[RowSummary]) -> list[TrajectorySummary]:
    """``rows`` as whole trajectories: rows naming one ``trajectory_key`` grouped (in piece order; rows
    with equal pieces in file order), a row without a key a trajectory of its own; in the order of each
    trajectory's first row."""
    found: dict[str | int, list[RowSummary]] = {}
    for s in rows:
        found.setdefault(s.key if s.keyed else s.row, []).append(s)
    return [whole(sorted(pieces, key=lambda s: s.piece)) for pieces in found.values()]
