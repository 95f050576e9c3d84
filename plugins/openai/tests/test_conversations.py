"""Conversation tracking on token ids alone: continuation, forks, eviction, expiry, recording."""

from __future__ import annotations

import json
import time
from pathlib import Path

from toolrl.engines import Generation
from toolrl_openai.conversations import RECORD_FILE, Conversations, Turn


class Letters:
    """A tokenizer stand-in: token i is the letter chr(97 + i)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i) for i in ids)


def _turn(ids: list[int]) -> Turn:
    return Turn(Generation(ids, [-0.5] * len(ids), "stop", ids[-1]), "", "done")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / RECORD_FILE).read_text().splitlines()]


def test_continuation_forks_and_recording(tmp_path: Path) -> None:
    closed: list[str] = []
    convs = Conversations(Letters(), tmp_path, idle_s=10, on_close=closed.append)
    prompt = [0, 1]
    assert convs.match(prompt) is None
    session = convs.session_for(None, 1)
    (cid,) = convs.add(prompt, [_turn([2, 3])], None, session)
    assert cid == session

    # The next prompt = prompt + completion + template tokens: the same conversation.
    second = [0, 1, 2, 3, 4, 5]
    base = convs.match(second)
    assert base is not None and base.conversation.id == cid and convs.session_for(base, 1) == cid
    # Two choices: the first continues, the second forks with the shared history.
    ids = convs.add(second, [_turn([6]), _turn([7])], base, None)
    assert ids[0] == cid and ids[1] != cid and len(convs) == 2

    # A prompt that does not extend anything open starts afresh.
    assert convs.match([0, 1, 2, 9]) is None
    convs.close_all()
    assert sorted(closed) == sorted(ids)
    rows = {r["trajectory_id"]: r for r in _rows(tmp_path)}
    main, fork = rows[ids[0]], rows[ids[1]]
    assert main["prompt_ids"] == [0, 1] and main["response_ids"] == [2, 3, 4, 5, 6]
    assert main["response_mask"] == [1, 1, 0, 0, 1] and main["logprobs"] == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert main["turns"] == 2 and main["prompt_text"] + main["response_text"] == "abcdefg"
    assert fork["response_ids"] == [2, 3, 4, 5, 7] and fork["response_mask"] == [1, 1, 0, 0, 1]
    assert "model_text" not in main


def test_a_conversation_extended_meanwhile_is_forked(tmp_path: Path) -> None:
    convs = Conversations(Letters(), tmp_path)
    (cid,) = convs.add([0], [_turn([1])], None, convs.session_for(None, 1))
    base = convs.match([0, 1, 2])
    # Two requests continue the same conversation concurrently; the second to finish forks, with
    # the history the conversation had when both arrived.
    assert convs.add([0, 1, 2], [_turn([3])], base, cid) == [cid]
    (other,) = convs.add([0, 1, 2], [_turn([4])], base, cid)
    assert other != cid
    convs.close_all()
    rows = {r["trajectory_id"]: r for r in _rows(tmp_path)}
    assert rows[cid]["response_ids"] == [1, 2, 3] and rows[cid]["response_mask"] == [1, 0, 1]
    assert rows[other]["response_ids"] == [1, 2, 4] and rows[other]["response_mask"] == [1, 0, 1]
    assert rows[other]["turns"] == 2


def test_idle_and_least_recently_used_conversations_close(tmp_path: Path) -> None:
    convs = Conversations(Letters(), tmp_path, idle_s=5, max_open=2)
    first = convs.add([0], [_turn([1])], None, None)[0]
    convs.add([2], [_turn([3])], None, None)
    convs.add([4], [_turn([5])], None, None)  # over max_open: the oldest is written
    assert [r["trajectory_id"] for r in _rows(tmp_path)] == [first] and len(convs) == 2
    assert convs.expire() == 0
    assert convs.expire(time.monotonic() + 5) == 2 and len(convs) == 0
    assert len(_rows(tmp_path)) == 3
