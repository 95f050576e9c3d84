"""One trajectory as the page shows it: the prompt's messages, then the response in runs of trained
(model) and untrained (tool results, template, simulated user) tokens. Trained runs are split into
tokens carrying the engine's log-prob, the trainer's and their difference (where the row records the
trainer's) and, from a per-token estimator, their advantage, so the page can mark what was trained and
colour it.

Token texts need the run's tokenizer: ``checkpoints/hf`` (saved by training), else the model the run's
``config.json`` names (built-in models are built offline; a Hub id is read from the local cache only).
Without one, the decoded texts the trace row holds are shown whole.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolrl_viewer.traces import TrajectorySummary

# Chat formats' turn markers: (start of a turn, capturing its role; end of a turn).
MARKERS = (
    (re.compile(r"<\|im_start\|>(\w+)\n?"), "<|im_end|>"),  # ChatML: Qwen, SmolLM
    (re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*"), "<|eot_id|>"),  # Llama 3
    (re.compile(r"<start_of_turn>(\w+)\n?"), "<end_of_turn>"),  # Gemma
    (re.compile(r"<\|start\|>(\w+)(?:<\|channel\|>\w+)?<\|message\|>"), "<|end|>"),  # gpt-oss
)


def split_messages(text: str) -> list[dict[str, str]]:
    """``text`` cut at its chat format's turn markers into ``{role, text}``; one ``{role: "text"}``
    block when no known marker is in it."""
    for start, end in MARKERS:
        found = list(start.finditer(text))
        if not found:
            continue
        out = []
        if head := text[:found[0].start()].strip():
            out.append({"role": "text", "text": head})
        for k, m in enumerate(found):
            body = text[m.end():found[k + 1].start() if k + 1 < len(found) else len(text)]
            body = body.split(end)[0].strip("\n")
            role = m.group(1)
            if role == "user" and body.lstrip().startswith("<tool_response>"):
                role = "tool"
            if body.strip():  # the generation prompt's empty assistant header
                out.append({"role": role, "text": body})
        return out
    return [{"role": "text", "text": text}]


class Tokenizers:
    """The tokenizer of each run, loaded once per source in a background thread started when the run's
    trajectories are first listed (transformers takes seconds to import), so opening one rarely waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._one_at_a_time = threading.Lock()
        self._loading: dict[str, threading.Thread] = {}
        self._loaded: dict[str, Any] = {}  # source -> tokenizer, or the reason there is none (str)

    @staticmethod
    def source(run: Path) -> str:
        hf = run / "checkpoints" / "hf"
        if (hf / "tokenizer_config.json").is_file():
            return str(hf)
        return str(run / "config.json")

    def preload(self, run: Path) -> None:
        key = self.source(run)
        with self._lock:
            if key not in self._loading:
                self._loading[key] = threading.Thread(target=self._load, args=(key,), daemon=True)
                self._loading[key].start()

    def get(self, run: Path, wait_s: float = 120.0) -> tuple[Any, str]:
        """``(tokenizer, "")`` or ``(None, why not)``."""
        self.preload(run)
        key = self.source(run)
        self._loading[key].join(wait_s)
        found = self._loaded.get(key, "the tokenizer is still loading")
        return (None, found) if isinstance(found, str) else (found, "")

    def _load(self, key: str) -> None:
        try:
            # One load at a time: two runs' first loads would import transformers' lazy modules from two
            # threads at once, which is not safe (a cold import can see a module half-initialised).
            with self._one_at_a_time:
                self._loaded[key] = _load_tokenizer(Path(key))
        except Exception as exc:  # any failure leaves the texts readable, whole
            self._loaded[key] = f"no tokenizer ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"


def _load_tokenizer(path: Path) -> Any:
    from toolrl.model_sources import load_tokenizer

    if path.is_dir():
        return load_tokenizer(path)
    if not path.is_file():
        raise FileNotFoundError(f"neither checkpoints/hf nor {path.name} in the run directory")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the viewer fetches nothing
    from toolrl.config import load_config
    from toolrl.model_sources import model_path
    from toolrl.plugin_support import read_json

    return load_tokenizer(model_path(load_config(None, data=read_json(path, "config.json"))))


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(start, end, mask value)`` of each run of equal mask values."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def _failed_texts(row: dict[str, Any]) -> list[str]:
    texts = []
    for r in row.get("tool_results") or []:
        if r.get("status") != "ok":
            text = ((r.get("response") or {}).get("text") or "").strip()
            if text:
                texts.append(text[:60])
    return texts + [(e.get("message") or "")[:60] for e in row.get("parse_errors") or [] if e.get("message")]


def view(row: dict[str, Any], tokenizer: Any, why_not: str = "") -> dict[str, Any]:
    """The page's model of trace row ``row``."""
    ids = list(row.get("response_ids") or [])
    mask = list(row.get("response_mask") or [0] * len(ids))
    logprobs = list(row.get("logprobs") or [])
    # The trainer's log-probs under the step's starting weights (trace rows since they were recorded;
    # null in rows never trained, absent in older runs).
    trainer = row.get("trainer_logprobs") if isinstance(row.get("trainer_logprobs"), list) else None
    advantage = row.get("advantage")
    per_token_adv = advantage if isinstance(advantage, list) else None
    failed = _failed_texts(row)
    segments: list[dict[str, Any]] = []
    if tokenizer is None or len(mask) != len(ids):
        segments.append({"trained": None, "text": row.get("response_text", ""), "error": False})
    else:
        for start, end, m in _runs(mask):
            if m:
                pieces = tokenizer.batch_decode([[t] for t in ids[start:end]], skip_special_tokens=False)
                segments.append({"trained": True, "tokens": [
                    _token(piece, ids[i], _at(logprobs, i), _at(trainer, i), _at(per_token_adv, i))
                    for i, piece in zip(range(start, end), pieces)]})
            else:
                text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
                segments.append({"trained": False, "text": text, "messages": split_messages(text),
                                 "error": any(f in text for f in failed)})
    results = [{"name": r.get("name"), "arguments": r.get("arguments"), "status": r.get("status"),
                "text": (r.get("response") or {}).get("text", ""), "latency_s": r.get("latency_s"),
                "images": len((r.get("response") or {}).get("images") or [])}
               for r in row.get("tool_results") or []]
    keep = ("trajectory_id", "sample_index", "problem", "k", "success", "group", "env", "reward", "reward_terms",
            "reward_errors", "tool_rewards", "tool_errors", "reward_parts", "termination", "error", "turns",
            "policy_version", "ground_truth", "user_turns", "parse_errors", "final_response", "piece")
    return {
        "meta": {k: row[k] for k in keep if k in row},
        "advantage": advantage if per_token_adv is None else {
            "per_token": True, "mean": sum(a for a, m in zip(per_token_adv, mask) if m) / max(sum(mask), 1)},
        "prompt": split_messages(row.get("prompt_text", "")),
        "segments": segments,
        "tool_results": results,
        "images": [img.get("png") for img in row.get("images") or [] if isinstance(img, dict)],
        "tokens_note": why_not,
        "trainer_logprobs": trainer is not None,
    }


def view_trajectory(found: TrajectorySummary, segments: list[dict[str, Any]], rows: list[dict[str, Any]],
                    tokenizer: Any, why_not: str = "") -> dict[str, Any]:
    """The page's model of a whole trajectory: ``meta``, the last piece's fields (its reward, terms,
    termination, answer: the trajectory's) with the figures of the whole (``found``: turns, tool calls and
    tokens summed over pieces, see toolrl_viewer.traces.whole); then each piece (``rows``, in order, with
    ``segments``: their index entries) as :func:`view` shows it, with its place, label and edit."""
    shown = [view(row, tokenizer, why_not) for row in rows]
    whole = ("trajectory_id", "segments", "turns", "tool_calls", "tool_failures", "response_tokens", "termination")
    meta = {k: v for k, v in shown[-1]["meta"].items() if k != "piece"} | {k: getattr(found, k) for k in whole}
    if found.segments == 1:
        del meta["segments"]
    per_token = any(isinstance(s["advantage"], dict) for s in shown)
    return {
        "trajectory_id": found.trajectory_id,
        "row": found.row,  # its first row in the file
        "meta": meta,
        "advantage": shown[0]["advantage"] if found.segments == 1
        else {"per_token": True, "mean": found.advantage} if per_token else found.advantage,
        "pieces": [{**s, **entry, "turns": row.get("turns", 0), "tool_calls": len(row.get("tool_results") or [])}
                   for s, entry, row in zip(shown, segments, rows)],
        "tokens_note": why_not,
        "trainer_logprobs": any(s["trainer_logprobs"] for s in shown),
    }


def _at(values: list[Any] | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


def _token(text: str, token_id: int, lp: Any, trainer_lp: Any, adv: Any) -> dict[str, Any]:
    """One trained token: its text and id, the engine's log-prob (``lp``), the trainer's (``tlp``) and
    their difference, trainer − engine (``dlp``; None unless both are numbers), and its advantage."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lp, trainer_lp))
    return {"t": text, "id": token_id, "lp": lp, "tlp": trainer_lp, "dlp": trainer_lp - lp if numbers else None,
            "adv": adv}
