"""What the page is served, without a browser: the byte-offset index of a trajectory file (filters, order,
pages, rows read by offset, files still being written), metrics read as a run appends them, two
evaluations compared, a trajectory split into turns with the real Qwen3 tokenizer, and the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from toolrl_viewer.runs import Run, compare
from toolrl_viewer.traces import TraceIndex, TraceQuery
from toolrl_viewer.turns import split_messages, view


def _row(i: int, **over) -> dict:
    row = {"trajectory_id": f"t{i}", "sample_index": i // 4, "group": i // 4, "env": "arithmetic" if i % 2 else "code",
           "prompt_ids": [1] * 50, "response_ids": [2] * (10 + i), "response_mask": [1] * (10 + i),
           "logprobs": [-0.5] * (10 + i), "turns": 1 + i % 3, "termination": "answered", "error": None,
           "reward": i / 10, "reward_errors": {}, "tool_errors": {}, "parse_errors": [], "advantage": i - 5.0,
           "tool_results": [{"name": "calculator", "status": "ok", "response": {"text": "3"}}]}
    return {**row, **over}


def _write(path: Path, rows: list[dict], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_index_filters_sorts_pages_and_reads_rows_by_offset(tmp_path):
    rows = [_row(i) for i in range(12)]
    rows[3] = _row(3, error="engine failed")
    rows[4] = _row(4, tool_results=[{"name": "calculator", "status": "error", "response": {"text": "bad"}}])
    rows[5] = _row(5, termination="max_turns", reward=float("nan"))
    rows[6] = _row(6, termination="forked", piece=1, parse_errors=[{"message": "unterminated"}])
    rows[8] = _row(8, termination="infra_error", error="InfrastructureError: sandbox unreachable",
                   tool_results=[{"name": "calculator", "status": "infra_error", "response": {"text": "gone"}}])
    # A per-token advantage (GAE) is summarised over trained tokens; a tool argument named like a token
    # list does not confuse the fast path.
    rows[7] = _row(7, response_mask=[1] * 8 + [0] * 9, advantage=[2.0] * 8 + [9.0] * 9,
                   tool_results=[{"name": "t", "status": "ok", "arguments": {"logprobs": ["]"]}, "response": {}}])
    path = tmp_path / "rollouts" / "step_00001.jsonl"
    _write(path, rows, tail='{"trajectory_id": "half-writ')  # a line still being written is not a row
    index = TraceIndex(path)
    page = lambda **q: index.page(TraceQuery(**q))  # noqa: E731
    assert page()["total"] == 12 and page()["envs"] == ["arithmetic", "code"]
    assert [r["response_tokens"] for r in page()["rows"]] == [10 + i for i in range(12)]
    assert page()["rows"][7]["advantage"] == 2.0 and page()["rows"][7]["tool_calls"] == 1
    assert [r["row"] for r in page(errors=True)["rows"]] == [3, 8]
    assert [r["row"] for r in page(infra_failures=True)["rows"]] == [8] and page()["rows"][8]["infra_failure"]
    assert [r["row"] for r in page(tool_failures=True)["rows"]] == [4, 6, 8]
    assert [r["row"] for r in page(truncated=True)["rows"]] == [5]
    assert [r["row"] for r in page(forked=True)["rows"]] == [6]
    assert [r["row"] for r in page(min_reward=0.45, max_reward=0.8)["rows"]] == [6, 7, 8]  # NaN matches no range
    assert all(r["env"] == "code" for r in page(env="code")["rows"]) and page(env="code")["matched"] == 6
    by_reward = page(sort="reward", desc=True)["rows"]
    assert [r["row"] for r in by_reward][:2] == [11, 10] and by_reward[-1]["row"] == 5  # non-finite last
    window = page(sort="advantage", offset=3, limit=4)
    assert [r["row"] for r in window["rows"]] == [3, 4, 5, 6] and window["matched"] == 12
    for k in (0, 6, 11):
        assert index.read(k) == json.loads(json.dumps(rows[k]))
    with pytest.raises(KeyError):
        index.read(12)
    _write(path, rows[:2])  # the file replaced (a step rewritten): the index follows
    assert index.page(TraceQuery())["total"] == 2


def test_metrics_are_read_as_the_run_appends_them(tmp_path):
    run = Run(0, tmp_path)
    line = lambda step: json.dumps({"step": step, "reward_mean": step / 2, "groups": [0, 1],  # noqa: E731
                                    "tool_latency_s": {"calculator": 0.1}, "reward_std": float("nan")}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(line(1) + line(2)[:10])
    assert run.metrics() == [{"step": 1, "reward_mean": 0.5, "tool_latency_s/calculator": 0.1}]
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(line(2)[10:] + line(3))
    assert [r["step"] for r in run.metrics(since=1)] == [2, 3]
    assert [r["step"] for r in run.metrics()] == [1, 2, 3]
    (tmp_path / "metrics.jsonl").write_text(line(1))  # a resumed run truncated it
    assert [r["step"] for r in run.metrics()] == [1]


def test_two_evaluations_compared_by_problem(tmp_path):
    def evaluation(name: str, successes: list[list[bool]], summary: dict) -> Run:
        rows = [_row(p * 10 + k, problem=p, k=k, success=ok, reward=float(ok))
                for p, oks in enumerate(successes) for k, ok in enumerate(oks)]
        _write(tmp_path / name / "results.jsonl", rows)
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
        return Run(0, tmp_path / name)

    a = evaluation("base", [[True, False], [False, False]], {"pass@1": 0.25, "model": "x"})
    b = evaluation("trained", [[True, True], [False, False], [True, True]], {"pass@1": 0.75, "model": "y"})
    assert a.is_eval and a.sources() == ["results"]
    c = compare(a, b)
    assert c["summary"] == [{"key": "pass@1", "a": 0.25, "b": 0.75, "diff": 0.5},
                            {"key": "model", "a": "x", "b": "y", "diff": None}]
    p0, p1, p2 = c["problems"]
    assert (p0["a"]["successes"], p0["b"]["successes"], p0["diff"]) == (1, 2, 0.5)
    assert p1["diff"] == 0 and p2["a"] is None and p2["diff"] is None and p2["b"]["reward"] == 1.0


def test_prompts_split_at_their_chat_format_markers():
    chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert split_messages(chatml) == [{"role": "system", "text": "Be brief."}, {"role": "user", "text": "Hi"}]
    tool = "<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert split_messages(tool) == [{"role": "text", "text": "<|im_end|>"},
                                    {"role": "tool", "text": "<tool_response>\n3\n</tool_response>"}]
    llama = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    assert split_messages(llama)[-1] == {"role": "user", "text": "Hi"}
    assert split_messages("plain text") == [{"role": "text", "text": "plain text"}]


def test_a_trajectory_in_turns_with_its_trained_tokens():
    from toolrl.model_sources import qwen_tokenizer

    tok = qwen_tokenizer("qwen3")
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call><|im_end|>'
    result = "\n<|im_start|>user\n<tool_response>\nError in 'expression': division by zero\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    answer = "The answer is 4.<|im_end|>"
    parts = [tok.encode(t, add_special_tokens=False) for t in (call, result, answer)]
    ids = [i for p in parts for i in p]
    mask = [1] * len(parts[0]) + [0] * len(parts[1]) + [1] * len(parts[2])
    row = _row(0, response_ids=ids, response_mask=mask, logprobs=[-0.25 if m else 0.0 for m in mask],
               advantage=[0.5 if m else 0.0 for m in mask], prompt_text="<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
               tool_results=[{"name": "calculator", "arguments": {"expression": "1/0"}, "status": "error",
                              "response": {"text": "Error in 'expression': division by zero"}}])
    shown = view(row, tok)
    first, tool, last = shown["segments"]
    assert first["trained"] and last["trained"] and tool["trained"] is False
    assert "".join(t["t"] for t in first["tokens"]) == call and "".join(t["t"] for t in last["tokens"]) == answer
    assert len(first["tokens"]) + len(last["tokens"]) == sum(mask)
    assert all(t["lp"] == -0.25 and t["adv"] == 0.5 for t in first["tokens"] + last["tokens"])
    assert tool["error"] and tool["messages"][-1]["role"] == "tool"
    assert shown["prompt"] == [{"role": "user", "text": "What is 2+2?"}]
    assert shown["advantage"] == {"per_token": True, "mean": 0.5}
    assert shown["tool_results"][0]["status"] == "error"
    # Without a tokenizer the decoded text is shown whole, with the reason.
    whole = view({**row, "response_text": "abc"}, None, "no tokenizer")
    assert whole["segments"] == [{"trained": None, "text": "abc", "error": False}]
    assert whole["tokens_note"] == "no tokenizer"


def test_the_trajectory_endpoint_gives_each_tokens_trainer_minus_engine_log_prob(tmp_path):
    """Over HTTP, as the page asks: a row recording the trainer's log-probs gives each trained token the
    engine's, the trainer's and their difference; a row of an older run (no field) or of an untrained
    trajectory (null) says there are none."""
    import threading
    import urllib.request

    from toolrl.model_sources import qwen_tokenizer
    from toolrl_viewer.server import serve

    tok = qwen_tokenizer("qwen3")
    tok.save_pretrained(tmp_path / "checkpoints" / "hf")  # the run's tokenizer, as training saves it
    ids = tok.encode("Sure: 4<|im_end|>\n<|im_start|>user\n3<|im_end|>\nok", add_special_tokens=False)
    mask = [1] * 4 + [0] * (len(ids) - 6) + [1] * 2
    engine = [-0.5 - 0.1 * j if m else 0.0 for j, m in enumerate(mask)]
    trainer = [lp + 0.25 * (-1) ** j if m else None for j, (lp, m) in enumerate(zip(engine, mask))]
    rows = [_row(0, response_ids=ids, response_mask=mask, logprobs=engine, trainer_logprobs=trainer),
            _row(1), _row(2, trainer_logprobs=None)]
    _write(tmp_path / "rollouts" / "step_00001.jsonl", rows)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "lp_mismatch": 0.25}) + "\n")
    server = serve([tmp_path], port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def get(path: str) -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=60) as r:
                return json.loads(r.read())

        assert [r["response_tokens"] for r in get("/api/traces?run=0&source=1")["rows"]] == [len(ids), 11, 12]
        shown = get("/api/trajectory?run=0&source=1&row=0")
        assert shown["trainer_logprobs"] is True and shown["tokens_note"] == ""
        assert shown["trajectory_id"] == "t0" and len(shown["pieces"]) == 1 and "segments" not in shown["meta"]
        tokens = [t for s in shown["pieces"][0]["segments"] if s["trained"] for t in s["tokens"]]
        trained = [j for j, m in enumerate(mask) if m]
        assert [t["id"] for t in tokens] == [ids[j] for j in trained]
        assert [t["lp"] for t in tokens] == [engine[j] for j in trained]
        assert [t["tlp"] for t in tokens] == [trainer[j] for j in trained]
        assert [t["dlp"] for t in tokens] == pytest.approx([0.25 * (-1) ** j for j in trained])
        for row in (1, 2):
            old = get(f"/api/trajectory?run=0&source=1&t=t{row}")  # by its id, as the page's address names it
            assert old["trainer_logprobs"] is False and old["row"] == row
            assert all(t["tlp"] is None and t["dlp"] is None and t["lp"] == -0.5
                       for s in old["pieces"][0]["segments"] if s["trained"] for t in s["tokens"])
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_refuses_a_directory_without_a_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "toolrl", "view", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "holds no run" in out.stderr and str(tmp_path) in out.stderr


def test_plotly_js_is_revalidated_not_sent_again(tmp_path):
    """A browser whose cached plotly.min.js has expired asks with its ETag and is answered 304 (it keeps
    its copy and the code compiled from it); another tag, or none, gets the whole file."""
    import threading
    import urllib.error
    import urllib.request

    from toolrl_viewer.server import plotly_js, serve

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    server = serve([tmp_path], port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/plotly.min.js"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            tag, body = r.headers["ETag"], r.read()
            assert r.headers["Cache-Control"] == "max-age=3600"
        assert body == plotly_js() and tag.startswith('"') and len(tag) > 10
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(urllib.request.Request(url, headers={"If-None-Match": tag}), timeout=60)
        assert answer.value.code == 304 and answer.value.headers["ETag"] == tag and answer.value.read() == b""
        with urllib.request.urlopen(urllib.request.Request(url, headers={"If-None-Match": '"other"'}), timeout=60) as r:
            assert r.status == 200 and r.read() == body
    finally:
        server.shutdown()
        server.server_close()


def _serve(path: Path):
    """A viewer server for run ``path`` on a free port, serving, and its GET (JSON; an error: (status, body))."""
    import threading
    import urllib.error
    import urllib.request

    from toolrl_viewer.server import serve

    server = serve([path], port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def get(route: str):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}{route}", timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    return server, get


def test_a_trajectory_in_pieces_is_one_row_with_figures_of_the_whole(tmp_path):
    """A trajectory saved in pieces, as the core writes them (toolrl.rollout.segments and branches:
    RunDir.write_traces): a main-line segment closed by a summary (no turns, no tool results), a fold
    branch (its own turn and call), and the main line's last segment (its turns, calls and termination);
    every piece with the trajectory's reward. The table lists it as one row whose figures are the
    whole's; opened (by key, as the page's address names it, or by any of its rows), its segments come
    in order, labelled with the edits that opened them."""
    from toolrl.run_dir import RunDir
    from toolrl.schemas import ToolResponse, ToolResult
    from toolrl.trajectory import ContextEdit, Trajectory

    class Decoder:
        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    def call(status: str = "ok") -> ToolResult:
        return ToolResult(name="calculator", arguments={"expression": "6*7"}, status=status,
                          response=ToolResponse(text="42" if status == "ok" else "Error"))

    def traj(tid: str, n: int, **over) -> Trajectory:
        return Trajectory(trajectory_id=tid, sample_index=0, group=0, env="ledger", prompt_ids=[1, 2],
                          response_ids=[3] * n, logprobs=[-0.5] * n,
                          **({"reward": 1.0, "response_mask": [1] * n} | over))

    summarised = ContextEdit(policy="summarise", action="summarise", turn=2, removed=[2, 3], tokens_before=900,
                             tokens_after=120, summary="key 7")
    folded = ContextEdit(policy="fold", action="fold", turn=3, tokens_before=400, tokens_after=80, task="add",
                         result="42")
    key = "s0-g0-1"
    pieces = [traj(f"{key}~0", 4, trajectory_key=key, piece=0, termination="forked"),
              traj(f"{key}~1", 3, trajectory_key=key, piece=1, termination="forked", turns=2, edit=folded,
                   tool_results=[call()]),
              traj(key, 5, trajectory_key=key, piece=2, turns=3, edit=summarised, tool_results=[call(), call("error")],
                   response_mask=[1, 1, 0, 0, 1])]  # two tokens of tool results: 3 trained
    trajs = [traj("s0-g0-0", 6, turns=1), *pieces, traj("s0-g0-2", 2, turns=1, reward=0.0)]
    # The whole's advantage: the mean over its trained tokens (4 × 1.0, 3 × 0.0, 3 × 0.2).
    advantages = {t.trajectory_id: 0.5 for t in trajs} | {f"{key}~0": 1.0, f"{key}~1": 0.0, key: 0.2}
    RunDir(tmp_path).write_traces(1, trajs, Decoder(), advantages=advantages)

    page = Run(0, tmp_path).traces("1").page(TraceQuery())
    assert (page["total"], page["pieces"], page["matched"]) == (3, 5, 3)
    row = page["rows"][1]
    assert [r["trajectory_id"] for r in page["rows"]] == ["s0-g0-0", key, "s0-g0-2"]
    # Summed over pieces: turns, calls, failures, tokens; the last piece's reward and termination.
    assert {k: row[k] for k in ("rows", "segments", "turns", "tool_calls", "tool_failures", "response_tokens",
                                "reward", "termination", "advantage", "forked", "row")} == {
        "rows": (1, 2, 3), "segments": 3, "turns": 5, "tool_calls": 3, "tool_failures": 1, "response_tokens": 12,
        "reward": 1.0, "termination": "answered", "advantage": pytest.approx(0.46), "forked": True, "row": 1}
    index = Run(0, tmp_path).traces("1")
    assert [r["trajectory_id"] for r in index.page(TraceQuery(forked=True))["rows"]] == [key]
    assert [r["trajectory_id"] for r in index.page(TraceQuery(sort="turns", desc=True))["rows"]][0] == key

    server, get = _serve(tmp_path)
    try:
        shown = get(f"/api/trajectory?run=0&source=1&t={key}")
        assert shown["trajectory_id"] == key and shown["row"] == 1 and get("/api/trajectory?run=0&source=1&row=2") == shown
        assert {k: shown["meta"][k] for k in ("turns", "tool_calls", "segments", "response_tokens", "reward")} == {
            "turns": 5, "tool_calls": 3, "segments": 3, "response_tokens": 12, "reward": 1.0}
        assert [(p["piece"], p["row"], p["turns"], len(p["tool_results"])) for p in shown["pieces"]] == [
            (0, 1, 0, 0), (1, 2, 2, 1), (2, 3, 3, 2)]
        labels = [p["label"] for p in shown["pieces"]]
        assert labels[0] == "segment 1 of 3: the start"
        assert labels[1].startswith("segment 2 of 3: opened by fold: branch called at main-line turn 3")
        assert labels[2].startswith("segment 3 of 3: opened by summarise: summarise at turn 2") and "key 7" in labels[2]
        assert [p["segments"][0]["text"] for p in shown["pieces"]] == ["3 3 3 3", "3 3 3", "3 3 3 3 3"]  # no tokenizer
        single = get("/api/trajectory?run=0&source=1&t=s0-g0-2")
        assert len(single["pieces"]) == 1 and single["meta"]["turns"] == 1 and "segments" not in single["meta"]
        assert get("/api/trajectory?run=0&source=1&t=nope") == (404, {"error": "step_00001.jsonl has no trajectory 'nope'"})
    finally:
        server.shutdown()
        server.server_close()


def test_a_trajectory_in_segments_lists_them_in_order_with_their_edits(tmp_path):
    """Context edits (toolrl.context) cut a trajectory into segments, each a trace row: the index finds
    a trajectory's segments in order, with the edit that opened each, wherever its rows are."""
    from toolrl.trajectory import ContextEdit, Trajectory

    def segment(piece: int, edit: ContextEdit | None, termination: str) -> dict:
        t = Trajectory(trajectory_id=f"s0-g0-0~{piece}", trajectory_key="s0-g0-0", piece=piece, sample_index=0,
                       group=0, prompt_ids=[1, 2], response_ids=[3] * (piece + 1), response_mask=[1] * (piece + 1),
                       logprobs=[-0.5] * (piece + 1), termination=termination, edit=edit)
        return t.model_dump(mode="json")

    summarised = ContextEdit(policy="summarise", action="summarise", turn=5, removed=[2, 3, 4], tokens_before=3100,
                             tokens_after=260, summary="Audit key: 123456.")
    windowed = ContextEdit(policy="window", action="window", turn=9, removed=[2], tokens_before=3000, tokens_after=900)
    folded = ContextEdit(policy="fold", action="fold", turn=3, tokens_before=1400, tokens_after=320,
                         task="Read pages 2 to 4.", result="Pages 2-4 read.")
    rows = [_row(0), segment(3, windowed, "answered"), segment(0, None, "forked"), segment(1, summarised, "forked"),
            segment(2, folded, "forked")]
    path = tmp_path / "traces" / "step_00001.jsonl"
    _write(path, rows)
    index = TraceIndex(path)
    segments = index.segments_of("s0-g0-0")
    assert [(s["row"], s["piece"], s["termination"]) for s in segments] == [(2, 0, "forked"), (3, 1, "forked"),
                                                                            (4, 2, "forked"), (1, 3, "answered")]
    assert segments[0]["edit"] == ""
    assert segments[1]["edit"] == ("summarise: summarise at turn 5, 3 messages removed or replaced, context 3100 → 260 "
                                   "tokens; summary: Audit key: 123456.")
    assert segments[2]["edit"] == ("fold: branch called at main-line turn 3 (main context 1400 tokens, branch prompt "
                                   "320); sub-task: Read pages 2 to 4.; returned: Pages 2-4 read.")
    assert segments[3]["edit"].startswith("window: window at turn 9, 1 messages")
    assert [s["row"] for s in index.segments_of("t0")] == [0]  # a trajectory in one piece
