"""What the transformers engine's KV copies cost a long multi-turn session (issue 33): a trajectory whose
first prompt is ``--prompt`` tokens, ``--turns`` turns of ``--new`` generated tokens each, every next
prompt the previous one plus its generation plus a ``--tool``-token tool result (the rollout's
``generate(..., session_id=...)`` calls, as ``toolrl.rollout`` makes them), on the real engine, CPU.

Between turns the engine keeps the session's KV; the copies it makes of a KV cache are timed where they
happen, by wrapping the engine's own functions from here (the library is not changed):

- save: ``_save_session``, the finished row's KV copied out of the batch buffer (end of every turn);
- load: ``_place_prefixes``, the kept KV copied into the next turn's prefill buffer;
- grow: ``_reserve``, a buffer that runs out of columns (twice the size) or row slots re-allocated;
- merge: ``_merge``, a turn's new row written into a free row slot of the running batch (its own KV);
- keep: ``_keep``, finished rows dropped while others run (a kept row past the end moves into a freed slot);
- compact: ``_compact``, padding columns dropped once they are a quarter of the cache (after the two above).

merge, keep and compact copy only with ``--sessions`` > 1, whose rows finish at different steps, so a
turn joins, and leaves, a running batch.

Times are exclusive (a nested wrapped call is counted once, in its own column); ``MB`` is the KV the
copies write. The anchor is the turn itself, measured in the same run: each ``generate`` call's wall
time; with ``--sessions`` > 1 (turns overlap) a round's wall time against all the round's copies (they
run on the engine's one worker thread, between model steps). The whole run is repeated ``--rounds``
times on one engine (fresh sessions; medians). The refusal of a prompt past the model's context is
checked (one line). Last line: ``session copy / turn: X.XXX``, the median over rounds of the copies'
share of the turns after the first (one session), or of the round (several).

    OMP_NUM_THREADS=1 python benchmarks/long_sessions.py [--prompt 8192] [--turns 3] [--new 64] [--tool 240]
                                                          [--sessions 1] [--shape tiny] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from _common import machine, median, single_thread, table

single_thread()

KINDS = ("save", "load", "grow", "merge", "keep", "compact")
# model.tiny overrides: the tests' tiny Qwen3 (hidden 64, 2 layers, one 64-wide KV head), and a model
# whose layers outweigh its 152k-vocabulary head (benchmarks/prefix_sharing.py's ``body``).
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "body": {"hidden_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 32, "intermediate_size": 4096},
}


class CopyMeter:
    """Wraps the engine's KV-copying methods (on it, its session store and its KV batches): exclusive seconds, calls and copied
    bytes per kind, in a log of (time, kind, seconds, bytes) so they can be split by turn."""

    def __init__(self, engine: Any, token_bytes: int) -> None:
        self.log: list[tuple[float, str, float, int]] = []
        self.columns: list[tuple[float, int]] = []  # (time, the batch buffer's columns after a _reserve)
        self._stack: list[float] = []  # per open wrapped call: time spent in wrapped calls inside it
        from toolrl.engines.transformers.kv_store import KVBatch

        e = engine
        self._wrap(e._sessions, "save", "save",
                   lambda a, r: _kv_bytes(e._sessions._kept.get(a[0].req.session_id)) if a[0].req.session_id else 0)
        self._wrap(KVBatch, "_place", "load", lambda a, r: r.nbytes)
        self._wrap(e, "_reserve", "grow", _batch_bytes_if_new)
        # Both end in a _compact and may _reserve (each counted on its own): their own copy is the rows
        # they move (keep: kept rows past the new end; merge: the joining rows), up to the write column.
        self._wrap(e, "_keep", "keep",
                   lambda a, r: sum(i >= len(a[1]) for i in a[1]) * a[-1] * token_bytes if 0 < len(a[1]) < a[-2]
                   else 0)
        self._wrap(e, "_merge", "merge",
                   lambda a, r: len(a[1].rows) * a[1].length * token_bytes if a[-2] and a[1].rows else 0)
        self._wrap(KVBatch, "compact", "compact", _batch_bytes_if_new)

    def _wrap(self, owner: Any, name: str, kind: str, size: Callable[[tuple[Any, ...], Any], int]) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any) -> Any:
            batch = args[0] if kind not in ("save", "load") else None
            # What the size functions need from before the call: the buffers, the rows, the columns.
            before = () if batch is None else (_buffer_ids(batch), len(batch.rows), batch.length)
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                result = inner(*args)
            finally:
                elapsed = time.perf_counter() - t0
                nested = self._stack.pop()
                if self._stack:
                    self._stack[-1] += elapsed
            nbytes = size((*args, *before), result)
            if name == "_reserve":
                self.columns.append((time.perf_counter(), args[0].capacity))
            self.log.append((time.perf_counter(), kind, elapsed - nested, nbytes))
            return result

        setattr(owner, name, timed)

    def between(self, start: float, end: float) -> dict[str, tuple[float, int]]:
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for t, kind, seconds, nbytes in self.log:
            if start <= t <= end:
                out[kind][0] += seconds
                out[kind][1] += nbytes
        return {k: (out[k][0], int(out[k][1])) for k in KINDS}


def _buffer_ids(batch: Any) -> set[int]:
    return {id(t) for t in batch.keys + batch.values}


def _batch_bytes_if_new(args: tuple[Any, ...], _result: Any) -> int:
    # The batch's KV buffers, when the call replaced them (a copy of the cache); 0 when it did not.
    batch, before = args[0], args[-3]
    tensors = [t for t in batch.keys + batch.values if id(t) not in before]
    return sum(t.nbytes for t in tensors)


def _kv_bytes(session: Any) -> int:
    return 0 if session is None else sum(t.nbytes for t in session.keys + session.values)


async def session(engine: Any, name: str, args: argparse.Namespace, rng: random.Random, new: int,
                  turns: list[dict[str, Any]]) -> None:
    from toolrl.engines import SamplingParams

    prompt = [rng.randrange(100, 150_000) for _ in range(args.prompt)]
    for turn in range(args.turns):
        saved = engine.stats.reused_tokens
        t0 = time.perf_counter()
        # No stop tokens: every turn generates exactly ``new`` tokens.
        gen = (await engine.generate(prompt, SamplingParams(max_new_tokens=new, seed=turn), session_id=name))[0]
        t1 = time.perf_counter()
        turns.append({"session": name, "turn": turn + 1, "prompt": len(prompt), "start": t0, "end": t1,
                      "reused": gen.prefill_tokens_saved, "new": len(gen.token_ids),
                      "stats_reused": engine.stats.reused_tokens - saved})
        prompt = prompt + gen.token_ids + [rng.randrange(100, 150_000) for _ in range(args.tool)]
    engine.end_session(name)


async def run(args: argparse.Namespace) -> None:
    from toolrl.engines import ModelSource, SamplingParams
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.model_sources import load_model, load_tokenizer, tiny_qwen3

    single_thread()
    path = tiny_qwen3(**SHAPES[args.shape])
    module = load_model(path, dtype="float32", device="cpu")
    engine = TransformersEngine.create(ModelSource(path=path, module=module, tokenizer=load_tokenizer(path)),
                                       {"device": "cpu", "max_batch_size": args.sessions})
    text = module.config.get_text_config()
    token_bytes = 2 * text.num_hidden_layers * text.num_key_value_heads * text.head_dim * 4
    print(f"model: tiny Qwen3 --shape {args.shape} ({text.num_hidden_layers} layers, "
          f"{text.num_key_value_heads} KV heads of {text.head_dim}, fp32): {token_bytes:,} bytes of KV per token")
    # Warm-up (first-call overheads), not measured.
    await engine.generate(list(range(100, 164)), SamplingParams(max_new_tokens=2), session_id="warm-up")
    engine.end_session("warm-up")
    meter = CopyMeter(engine, token_bytes)
    rounds = []
    for r in range(args.rounds):
        turns: list[dict[str, Any]] = []
        rng = random.Random(r)
        t0 = time.perf_counter()
        # Sessions generate different lengths, so rows finish at different steps and turns join a running batch.
        await asyncio.gather(*(session(engine, f"r{r}s{s}", args, random.Random(rng.random()),
                                       args.new + s * args.new // args.sessions, turns)
                               for s in range(args.sessions)))
        rounds.append((turns, t0, time.perf_counter() - t0))

    # Per turn (one session): medians over the rounds.
    per_turn: dict[int, list[dict[str, Any]]] = defaultdict(list)
    shares = []
    for turns, t0, wall in rounds:
        later = [0.0, 0.0]
        for t in turns:
            c = meter.between(t["start"], t["end"])
            t["turn_s"], t["copies"] = t["end"] - t["start"], c
            t["columns"] = max((n for when, n in meter.columns if t["start"] <= when <= t["end"]), default=0)
            per_turn[t["turn"]].append(t)
            if t["turn"] > 1:
                later[0] += sum(sec for sec, _ in c.values())
                later[1] += t["turn_s"]
        whole = meter.between(t0, t0 + wall)
        shares.append(later[0] / later[1] if args.sessions == 1 else sum(sec for sec, _ in whole.values()) / wall)
    if args.sessions == 1:
        rows = []
        for turn, ts in sorted(per_turn.items()):
            turn_s = median([t["turn_s"] for t in ts])
            ms = {k: median([t["copies"][k][0] for t in ts]) * 1e3 for k in KINDS}
            rows.append([turn, f"{ts[0]['prompt']:,}", f"{ts[0]['reused']:,}", ts[0]["new"], f"{turn_s:.3f}",
                         *(f"{ms[k]:.1f}" for k in KINDS), f"{sum(ms.values()) / 1e3 / turn_s:.4f}",
                         f"{sum(b for _, b in ts[0]['copies'].values()) / 2**20:.1f}", f"{ts[0]['columns']:,}"])
        print(f"per turn, median of {args.rounds} round(s):")
        print(table(["turn", "prompt", "reused", "new", "turn s", *(f"{k} ms" for k in KINDS), "copy/turn",
                     "copied MB", "buffer columns"], rows))
    totals = [meter.between(t0, t0 + wall) for _, t0, wall in rounds]
    walls = [wall for _, _, wall in rounds]
    print(f"whole rounds ({args.sessions} session(s) each), median of {args.rounds}:")
    print(table(["copy", "copies", "ms", "MB copied", "share of wall"],
                [[k, sum(1 for _, kind, _, b in meter.log if kind == k and b) // args.rounds,
                  f"{median([c[k][0] for c in totals]) * 1e3:.1f}", f"{totals[0][k][1] / 2**20:.1f}",
                  f"{median([c[k][0] / w for c, w in zip(totals, walls)]):.4f}"] for k in KINDS]))
    print(f"round wall {median(walls):.2f} s; one {args.prompt:,}-token session's KV: "
          f"{args.prompt * token_bytes / 2**20:.1f} MB; copy share per round: {', '.join(f'{x:.4f}' for x in shares)}")

    # The refusal of a prompt past the model's context: one line, before any work.
    too_long = [100] * engine.max_model_len
    try:
        await engine.generate(too_long, SamplingParams(max_new_tokens=1))
        print("refusal: none (the engine accepted a prompt as long as its context)")
    except ValueError as exc:
        lines = str(exc).splitlines()
        print(f"refusal ({len(lines)} line): {type(exc).__name__}: {str(exc)}")
    await engine.close()
    print(f"session copy / turn: {median(shares):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=8192, help="first prompt's tokens")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--new", type=int, default=64, help="tokens generated per turn (first session)")
    parser.add_argument("--tool", type=int, default=240, help="tool-result tokens added after each turn")
    parser.add_argument("--sessions", type=int, default=1,
                        help="concurrent sessions (session i generates new × (1 + i / sessions) tokens a turn)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--rounds", type=int, default=3, help="the whole run repeated (fresh sessions)")
    args = parser.parse_args()
    print(machine())
    asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
