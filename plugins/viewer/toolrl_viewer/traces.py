"""A trajectory file (``rollouts/step_NNNNN.jsonl``, an evaluation's ``results.jsonl``) as a byte-offset
index: one pass records where each row starts and the few fields the table filters and sorts on; a
page of the table and an opened trajectory are then read from disk by offset. Nothing holds a whole
file of token ids in memory.
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
            return b'"' + m.group(1) + b'": []'

        try:
            row = json.loads(NUMBER_LISTS.sub(cut, line))
        except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
            row = None
        if isinstance(row, dict):
            row["response_tokens"] = lengths.get(b"response_ids", 0)
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
        edit=edit_note(row.get("edit")),
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

    def keep(self, s: RowSummary) -> bool:
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

    def rows(self) -> list[RowSummary]:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._rows, self._stamp = self._build(), stamp
            return self._rows

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
        rows = self.rows()
        kept = [s for s in rows if query.keep(s)]
        if query.sort != "row":
            # Rows without the figure (a non-finite reward, no advantage) go last either way.
            present = [s for s in kept if getattr(s, query.sort) is not None]
            missing = [s for s in kept if getattr(s, query.sort) is None]
            kept = sorted(present, key=lambda s: getattr(s, query.sort), reverse=query.desc) + missing
        elif query.desc:
            kept.reverse()
        window = kept[query.offset:query.offset + query.limit]
        return {"total": len(rows), "matched": len(kept), "offset": query.offset,
                "envs": sorted({s.env for s in rows if s.env}),
                "rows": [{k: v for k, v in asdict(s).items() if k != "offset"} for s in window]}

    def segments_of(self, key: str) -> list[dict[str, Any]]:
        """The segments (pieces) of trajectory ``key`` in order: row, piece, the edit that opened it,
        how it ended, its response tokens."""
        return [{"row": s.row, "piece": s.piece, "edit": s.edit, "termination": s.termination,
                 "response_tokens": s.response_tokens}
                for s in sorted((s for s in self.rows() if s.key == key), key=lambda s: s.piece)]

    def read(self, row: int) -> dict[str, Any]:
        """Row ``row`` in full, read at its offset."""
        rows = self.rows()
        if not 0 <= row < len(rows):
            raise KeyError(f"{self.path.name} has no row {row}")
        with self.path.open("rb") as f:
            f.seek(rows[row].offset)
            return json.loads(f.readline())
